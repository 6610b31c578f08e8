"""Drawing (layer 8): reporters draw a finished diagnosis; they compute nothing.

`terminal`, `html` (with `_html_page`, `_html_charts`, `_html_parts` and `envelope`, which cuts long
series for charts), `ps`, `watch` and `ci_checks` draw; `plugin_peak` words what filled a pytest
vram_limit test's peak for the plugin's failure; `notebook` draws what `%gpumemdoctor` found in a
kernel; `vocabulary` holds the words that the
terminal report and the HTML page share (what each verdict means, what the parts of a peak are
called), so that both say the same; `console` is the one console wrapper (colour, width, which stream). The JSON report is
written and read back by `app/report_file.py`.
"""
