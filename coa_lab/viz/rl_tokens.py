"""Token-level view of one RL rollout: what the policy-gradient loss does with each token.

    HTML(advantage_tokens_html(tok, r.response_ids, r.response_mask, advantage, grad=row_grad))

A policy token is tinted by the sign of its sample's advantage (green: pushed up, red: pushed
down, white: advantage 0, nothing learned); an observation token (tool output) is hatched and
struck out, as in the SFT mask view: the loss never sees it. With `grad`, the per-token gradient
of the loss with respect to that token's log-prob is in each token's tooltip, and tokens that
received none are faded.
"""

from __future__ import annotations

from coa_lab.viz.sft_mask import MASKED_STYLE, as_id_list, token_text
from coa_lab.viz.style import FONT, MONO, esc

_UP = "background:#c8f0d2;border-bottom:2px solid #2e9e53"
_DOWN = "background:#f9d0cc;border-bottom:2px solid #c0392b"
_ZERO = "background:#ffffff;border-bottom:2px solid #cccccc"


def advantage_tokens_html(tokenizer, response_ids, response_mask, advantage: float, grad=None,
                          max_tokens: int | None = None) -> str:
    """One rollout's response tokens: policy tokens coloured by the advantage's sign, observation
    tokens struck out; `grad` (one value per response token) goes in the tooltips."""
    ids, mask = as_id_list(response_ids), as_id_list(response_mask)
    if len(ids) != len(mask):
        raise ValueError(f"response_ids has {len(ids)} tokens but response_mask has {len(mask)}")
    grads = [float(g) for g in (grad.tolist() if hasattr(grad, "tolist") else grad)] if grad is not None else None
    if grads is not None and len(grads) != len(ids):
        raise ValueError(f"grad has {len(grads)} values but the response has {len(ids)} tokens")
    advantage = float(advantage)
    style = _UP if advantage > 0 else _DOWN if advantage < 0 else _ZERO
    kind = "up" if advantage > 0 else "down" if advantage < 0 else "zero"
    shown = len(ids) if max_tokens is None else min(max_tokens, len(ids))
    spans = []
    for i in range(shown):
        text = esc(token_text(tokenizer, ids[i]))
        if not mask[i]:
            spans.append(f'<span class="coa-rl-tok coa-rl-masked" title="#{i} observation: masked" style="{MASKED_STYLE};margin:0 1px">{text}</span>')
            continue
        tip = f"#{i} advantage {advantage:+.2f}"
        faded = ""
        if grads is not None:
            tip += f", d loss / d log p = {grads[i]:+.2e}"
            faded = "" if grads[i] != 0 else ";opacity:0.45"
        spans.append(f'<span class="coa-rl-tok coa-rl-{kind}" title="{tip}" style="{style};margin:0 1px{faded}">{text}</span>')
    more = f" … ({len(ids) - shown} more tokens)" if shown < len(ids) else ""
    n_policy = sum(mask)
    head = (f'<div style="margin-bottom:4px">advantage <b>{advantage:+.2f}</b>: {n_policy} policy tokens '
            f'{"pushed up" if advantage > 0 else "pushed down" if advantage < 0 else "untouched"}, '
            f'{len(ids) - n_policy} observation tokens masked</div>')
    body = f'<div style="white-space:pre-wrap;word-break:break-word;{MONO};line-height:1.8">{"".join(spans)}{more}</div>'
    return f'<div class="coa-rl-tokens" style="{FONT};margin-bottom:10px">{head}{body}</div>'
