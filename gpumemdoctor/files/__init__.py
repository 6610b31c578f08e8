"""Files the tool reads from outside and files it writes (layer 2: above the basics, `errors`, `units`,
`growth`, `stray_rule` and `contract`, of which it uses the first two).

`inputs` reads reports, baselines and run files with a real size bound, regular files only, as
strict JSON; `schema` checks what they hold, field by field against a declared shape; `outputs` writes
the tool's own files (0600, never one over another or over an input), checked before the target runs.
Nothing here knows NVML, torch or a diagnosis.
"""
