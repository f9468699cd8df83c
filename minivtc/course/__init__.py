"""Coursework: assignments in which students write the engine's mechanisms themselves.

`assignments.py` lists them (which functions of the package each one asks for, and its graded
tests in `graded/`); `edition.py` writes the student edition (the package with those functions'
bodies replaced by `raise NotImplementedError`); `grade.py` grades an edition, one assignment at
a time, against the reference for everything else. The reference solutions are the package's
own code: one source of truth. `minivtc course release OUT` and `minivtc course grade OUT`.
Each assignment's points are a rubric by mechanism (`assignments.Line`); `rules.py` holds what
a submission may not do (reach for a reference policy), applied alike by `course grade` and
`course test`; `staff.py` lets the edition's lessons run on the staff's compiled answers, and
`course test KEY` run every assignment but KEY on them (`staffed.py`), as grading runs the
reference's.
"""

# The student edition's copy says True (`edition.release` writes it): grading needs the
# reference solutions, which that edition does not hold (`minivtc course test` works there).
STUDENT_EDITION = False
