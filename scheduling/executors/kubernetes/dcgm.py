"""GPU utilisation from NVIDIA's DCGM exporter (its Prometheus text on each node).

Only two gauges are read: ``DCGM_FI_DEV_GPU_UTIL`` (percent) and ``DCGM_FI_DEV_FB_USED``
(MiB of framebuffer used). Each line's ``gpu`` label is the GPU's index on the node; the
exporter adds ``pod`` and ``namespace`` labels where the kubelet tells it which Pod holds
the GPU, which is how samples are matched to Sluice's jobs.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.request

_LINE_RE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"


@dataclasses.dataclass
class DcgmGpu:
    index: int
    uuid: str = ""
    pod: str = ""
    namespace: str = ""
    utilization: float | None = None
    memory_used_mb: int | None = None


def parse(text: str) -> list[DcgmGpu]:
    """The GPUs of one exporter page, in index order (lines it cannot read are skipped)."""
    gpus: dict[int, DcgmGpu] = {}
    for line in text.splitlines():
        if not line.startswith((UTIL, FB_USED)):
            continue
        match = _LINE_RE.match(line)
        if not match or match["name"] not in (UTIL, FB_USED):
            continue
        labels = dict(_LABEL_RE.findall(match["labels"] or ""))
        try:
            index = int(labels["gpu"])
            value = float(match["value"])
        except (KeyError, ValueError):
            continue
        gpu = gpus.setdefault(index, DcgmGpu(index=index))
        gpu.uuid = labels.get("UUID", gpu.uuid)
        gpu.pod = labels.get("pod", gpu.pod)
        gpu.namespace = labels.get("namespace", gpu.namespace)
        if match["name"] == UTIL:
            gpu.utilization = value
        else:
            gpu.memory_used_mb = int(value)
    return [gpus[i] for i in sorted(gpus)]


def fetch(url: str, timeout: float = 2.0) -> list[DcgmGpu]:
    """Read one exporter; raises OSError (or ValueError) when it does not answer."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (site's URL)
        return parse(response.read().decode("utf-8", errors="replace"))
