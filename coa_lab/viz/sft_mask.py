"""Token-level view of one SFT example: which tokens the loss sees.

    HTML(mask_html(tok, row["input_ids"], row["labels"]))
"""

from __future__ import annotations

from coa_lab.viz.style import FONT, HATCH, MONO, esc

IGNORE_INDEX = -100  # same as coa_lab.training.sft.IGNORE_INDEX; not imported, to keep torch optional
_TRAINED_STYLE = "background:#c8f0d2;border-bottom:2px solid #2e9e53"
MASKED_STYLE = f"background:{HATCH};color:#999;text-decoration:line-through"


def as_id_list(values) -> list[int]:
    # Accept lists, tuples, numpy arrays and torch tensors alike.
    return [int(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


def token_text(tokenizer, token_id: int) -> str:
    # Decoded one at a time, a token holding part of a multi-byte character shows as U+FFFD;
    # that is the honest view of what the model sees.
    text = tokenizer.decode([token_id])
    # Make whitespace visible: a masked newline must still show up as a masked token.
    return text.replace("\n", "\u21b5\n").replace("\t", "\u2192") or "\u2205"


def _mask_summary(n_tokens: int, n_masked: int) -> str:
    return (f'<div class="coa-mask-summary" style="margin-bottom:6px">{n_tokens} tokens: '
            f'<span style="{_TRAINED_STYLE}">{n_tokens - n_masked} trained</span>, '
            f'<span style="background:{HATCH};color:#666">{n_masked} masked (label -100)</span></div>')


def mask_html(tokenizer, input_ids, labels) -> str:
    """Token-level view of one SFT example: trained tokens highlighted, -100 tokens struck out."""
    ids, labs = as_id_list(input_ids), as_id_list(labels)
    if len(ids) != len(labs):
        raise ValueError(f"input_ids has {len(ids)} tokens but labels has {len(labs)}")
    spans = []
    for position, (token_id, label) in enumerate(zip(ids, labs)):
        masked = label == IGNORE_INDEX
        cls = "coa-tok coa-tok-masked" if masked else "coa-tok coa-tok-trained"
        style = MASKED_STYLE if masked else _TRAINED_STYLE
        spans.append(f'<span class="{cls}" title="#{position} id={token_id}" '
                     f'style="{style};margin:0 1px">{esc(token_text(tokenizer, token_id))}</span>')
    n_masked = sum(label == IGNORE_INDEX for label in labs)
    tokens = f'<div style="white-space:pre-wrap;word-break:break-word;{MONO};line-height:1.8">{"".join(spans)}</div>'
    return f'<div class="coa-mask" style="{FONT}">{_mask_summary(len(ids), n_masked)}{tokens}</div>'
