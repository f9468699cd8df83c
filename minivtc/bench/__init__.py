"""Every measurement, each a `minivtc bench ...` command (`suite.py` is their command line;
`python -m minivtc.bench gpu` is the GPU check). What each measured: `README.md` here.
"""
