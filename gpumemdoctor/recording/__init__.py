"""What one run measured, as data (layer 5).

`records` gives the shape of each record an agent writes; `agent_files` reads the agents' files as
they grow (the combine step); `recording` holds everything measured in one run, to and from JSON;
`series` is the bounded timeline every long series is kept in. No judgement is made here.
"""
