"""Grading: `distlab grade SUBMISSIONS/` for an instructor, `distlab check mylabs/` for a student.

A tool on the roof (it reads every chapter's checks). Its files:

- `registry.py`: the course's exercises, read from the labs (each check call in a cell with a solution);
- `hidden_cases.py`: the instructor-only cases of each check (kept out of the student versions);
- `extract.py`: what of a notebook runs (read with `ast`: the lab's setup, the student's definitions);
- `engine.py`: one guarded, time-bounded process per student and lab; `child.py` is that process;
- `guard.py`: the audit hook that refuses writes outside the process's temporary folder;
- `report.py`: grades.csv, grades.json and the offline grades.html;
- `grade.py`: the two commands.
"""
