"""coa-lab: learn, run and extend Chain-of-Agents agentic RL (arXiv 2508.13167).

Stages live in one obvious place each:
capture -> coa_lab.agents.teacher, distill -> coa_lab.distill, sft -> coa_lab.sft,
rl -> coa_lab.rl, eval -> coa_lab.evaluate.  The CoA format itself is coa_lab.protocol.
"""

__version__ = "0.1.0"
