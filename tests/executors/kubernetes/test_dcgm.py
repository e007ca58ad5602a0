"""GPU samples from a DCGM exporter page, under the GPU indices Sluice chose."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from scheduling.executors.kubernetes import dcgm
from scheduling.executors.kubernetes.pods import pod_name
from tests.executors.kubernetes.conftest import make_executor, poll_until
from tests.executors.kubernetes.test_kubernetes_executor import NS, launch

PAGE = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="gpu-1"} 0
DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-d",Hostname="gpu-1",pod="POD",namespace="sluice-acme"} 87
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",Hostname="gpu-1"} 0
DCGM_FI_DEV_FB_USED{gpu="3",UUID="GPU-d",Hostname="gpu-1",pod="POD",namespace="sluice-acme"} 40960
DCGM_FI_DEV_SM_CLOCK{gpu="0"} 1980
"""


def test_parse():
    gpus = dcgm.parse(PAGE.replace("POD", "p"))
    assert [(g.index, g.utilization, g.memory_used_mb, g.pod) for g in gpus] == [
        (0, 0.0, 0, ""),
        (3, 87.0, 40960, "p"),
    ]


def test_samples_follow_sluices_indices(standin):
    page = (PAGE.replace("POD", pod_name(7, 1, "gpu-1"))).encode()

    class Exporter(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    executor = make_executor(standin, dcgm_urls={"gpu-1": url})
    try:
        executor.launch("gpu-1", launch(gpus=(1,)))
        standin.run(NS, pod_name(7, 1, "gpu-1"))
        poll_until(executor, lambda ev: ev)
        samples = {s.index: s for s in executor.gpu_samples()}
        # The device plugin gave GPU 3; Sluice placed the job on GPU 1: reported as 1.
        assert (samples[1].utilization, samples[1].memory_used_mb) == (87.0, 40960)
        assert samples[0].utilization == 0.0 and 3 not in samples
        assert not executor.capabilities().notes[-1].startswith("no DCGM")
    finally:
        executor.close()
        server.shutdown()


def test_without_dcgm_no_samples_and_capabilities_say_so(executor):
    assert executor.gpu_samples() == []
    assert any("no DCGM" in note for note in executor.capabilities().notes)
