// Sluice's own script. The Content-Security-Policy allows scripts from this site only
// (script-src 'self'): no inline handlers in the pages; behaviours live here instead.
"use strict";

// <select data-autosubmit>: choosing an option submits its form (a <noscript> button does
// the same without JavaScript).
document.addEventListener("change", (event) => {
  const field = event.target;
  if (field instanceof HTMLSelectElement && field.hasAttribute("data-autosubmit") && field.form) {
    field.form.submit();
  }
});

// <form data-confirm="…"> or <button data-confirm="…">: ask before a destructive step
// (cancel, reject, revoke, remove). In the text, {n} is the number of jobs ticked for the
// form and {step} the label of the button pressed. Nothing ticked: say so, send nothing.
document.addEventListener("submit", (event) => {
  const form = event.target;
  const button = event.submitter;
  const text = (button && button.dataset.confirm) || form.dataset.confirm;
  if (!text) return;
  const ticked = document.querySelectorAll(`input[name=job][form="${form.id}"]:checked`).length;
  if (text.includes("{n}") && ticked === 0) {
    event.preventDefault();
    window.alert("Tick the jobs first.");
    return;
  }
  const step = button ? button.textContent.trim() : "Do";
  if (!window.confirm(text.replaceAll("{n}", String(ticked)).replaceAll("{step}", step))) {
    event.preventDefault();
  }
});

// Live parts (data-live, polled by htmx): skip a refresh while the person is working in
// it (typing, a ticked box), so their input is not swapped away; an opened <details> with
// an id stays open across refreshes.
function isBusy(part) {
  const active = document.activeElement;
  if (active && part.contains(active) && active.matches("input, textarea, select")) return true;
  if (part.querySelector("input[type=checkbox]:checked")) return true;
  for (const field of part.querySelectorAll("input[type=text], textarea")) {
    if (field.value !== field.defaultValue) return true;
  }
  return false;
}
const openDetails = new Map();
document.addEventListener("htmx:beforeRequest", (event) => {
  const part = event.detail.elt;
  if (!part.hasAttribute("data-live")) return;
  if (isBusy(part)) {
    event.preventDefault();
    return;
  }
  openDetails.set(part.id, [...part.querySelectorAll("details[open][id]")].map((d) => d.id));
});
document.addEventListener("htmx:load", (event) => {
  const part = event.detail.elt;
  if (!(part instanceof Element) || !openDetails.has(part.id)) return;
  for (const id of openDetails.get(part.id)) {
    const details = document.getElementById(id);
    if (details) details.open = true;
  }
});

// The jobs list: a box in the header ticks every row of the page.
document.addEventListener("change", (event) => {
  const all = event.target;
  if (all.id !== "select-all") return;
  for (const box of document.querySelectorAll(`input[name=job][form="${all.getAttribute("form")}"]`)) {
    box.checked = all.checked;
  }
});

// The submit form: offer only the GPU models of the chosen queue's pool, and no more GPUs
// per node than its largest node of that model has.
function fitGpuChoices() {
  const queue = document.getElementById("id_queue");
  const model = document.getElementById("id_gpu_model");
  const perNode = document.getElementById("id_gpus_per_node");
  if (!queue || !model) return;
  const chosen = queue.selectedOptions[0];
  const pool = chosen ? chosen.dataset.pool : undefined;
  let largest = 0;
  for (const option of model.options) {
    if (!option.value) continue;
    const fits = !pool || (option.dataset.pools || "").split(" ").includes(pool);
    option.hidden = !fits;
    option.disabled = !fits;
    if (fits) largest = Math.max(largest, Number(option.dataset.perNode || 0));
    if (!fits && option.selected) model.value = "";
  }
  const picked = model.selectedOptions[0];
  const max = picked && picked.value ? Number(picked.dataset.perNode || 0) : largest;
  if (perNode && max > 0) perNode.max = String(max);
}
document.addEventListener("change", (event) => {
  if (event.target.id === "id_queue" || event.target.id === "id_gpu_model") fitGpuChoices();
});
document.addEventListener("DOMContentLoaded", fitGpuChoices);
