import sys
def test_probe():
    import scheduling.agent.protocol
    print(__name__, sys.path[:3])
    from tests.scheduling.agent.conftest import launch
