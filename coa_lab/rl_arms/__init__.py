"""`coa-lab arms`: RL arms from ONE SFT adapter and ONE screened pool, across seeds, each adapter
read on the same tasks (greedy, and avg@K / pass@K at RL's sampling temperature), compared in
pairs with coa_lab/comparison.py.

    spec.py     what an arm is: a name and --set-style overrides (built-ins: control, rl, rl+ptx, rft)
    readout.py  one adapter on the split's tasks -> per-task outcomes on disk (scores/<arm>_seed<s>.json)
    table.py    the paired table, recomputed from those files alone (no model needed)
    runner.py   one arm's run folder: trained, resumed from its checkpoint, or restarted clean
    command.py  the command: train what is missing, read it, write OUT/arms.json, print the table
"""
