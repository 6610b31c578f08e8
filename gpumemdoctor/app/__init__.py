"""The application (layer 9): what the commands run, report and compare do with a recording once the
CLI has checked their options and files, sequenced once.

`pipeline` is that sequence: a recording diagnosed, its JSON report written, its HTML page and its
terminal report drawn, then the CI gate (`after_run`, `show`, `compare`; `prepare` imports what it needs
while the target runs). `report_file` is the JSON report: a diagnosis with its recording, written and
read back strictly; `baseline_file` the baseline file read and written; `checks` the gate's policy from
the options given and its results drawn, written as JUnit XML and appended to GitHub's step summary.
"""
