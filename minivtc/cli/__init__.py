"""The `minivtc` command line, in one place above every layer: `main.py` lists the commands;
each command's flags live beside it here.
"""
