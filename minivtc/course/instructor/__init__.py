"""The instructor's pages and the design assignments' answers and hidden seed: none of this
folder is in the student edition (`edition.INSTRUCTOR_ONLY`)."""
