"""coa-lab: learn, run and extend Chain-of-Agents agentic RL (arXiv 2508.13167).

Stages live in one obvious place each:
capture -> coa_lab.capture (the teacher, the recorder), distill -> coa_lab.distill,
sft -> coa_lab.training.sft, rl -> coa_lab.rl, eval -> coa_lab.evaluate; the student's rollout
loop that RL and evaluation share -> coa_lab.student_rollout. The CoA format itself is
coa_lab.protocol; `pipeline` runs the stages in order, `cli` is `coa-lab`.
"""

__version__ = "0.1.0"
