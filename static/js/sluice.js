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
