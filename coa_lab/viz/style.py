"""The look every view shares: one colour per agent role, fonts, and the small HTML pieces
(escaped text, badges, coloured boxes) the trajectory, mask and browser views are built from.
Styles are inline rather than in a <style> block because some frontends sanitize <style> out
of untrusted outputs."""

from __future__ import annotations

import html

# One hue per agent role (Okabe-Ito-like, distinguishable with common colour-vision
# deficiencies); each is a (border, background) pair so text on it stays readable.
ROLE_COLOURS: dict[str, tuple[str, str]] = {
    "think": ("#0072b2", "#e3f0fa"),
    "plan": ("#e69f00", "#fdf1d8"),
    "reflection": ("#cc79a7", "#f8e6f0"),
    "suggested_answer": ("#009e73", "#dcf3ea"),
    "double_check": ("#6a3d9a", "#eee6f6"),
    "answer": ("#d55e00", "#fbe5d6"),
}
TOOL_COLOURS = ("#333333", "#f4f4f4")
OBSERVATION_COLOURS = ("#999999", "#eeeeee")
# Diagonal hatching = "not part of the loss", the same convention mask_html uses.
HATCH = "repeating-linear-gradient(135deg,#eeeeee 0 8px,#e2e2e2 8px 16px)"

FONT = "font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;line-height:1.45"
MONO = "font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px"
PRE = f"margin:4px 0 0 0;white-space:pre-wrap;word-break:break-word;{MONO}"


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def badge(label: str, colour: str, cls: str = "coa-badge") -> str:
    return (f'<span class="{cls}" style="display:inline-block;padding:0 6px;border-radius:8px;'
            f'background:{colour};color:#fff;font-size:11px;font-weight:600;margin-right:4px">'
            f"{esc(label)}</span>")


def box(cls: str, border: str, background: str, inner: str, tag: str = "") -> str:
    data = f' data-tag="{esc(tag)}"' if tag else ""
    return (f'<div class="{cls}"{data} style="border-left:4px solid {border};background:{background};'
            f'padding:4px 8px;margin:4px 0;border-radius:3px">{inner}</div>')
