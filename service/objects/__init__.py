"""Object storage: checkpoints and artifacts of jobs, kept where every box reaches them
(``TRAINYARD_STORAGE_URL``). ``store`` is the one module that talks to it; ``layout``
says where each thing lives and which manifests make a set of files whole."""
