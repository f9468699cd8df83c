"""The graded tests, one file per assignment (`assignments.py`). They ship with the student
edition, so they import only the package, pytest, hypothesis and transformers."""
