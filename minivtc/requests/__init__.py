"""The shared vocabulary at the bottom of the package: a request (`request.py`) and its
sampling parameters (`params.py`). Plain Python, no tensors."""
