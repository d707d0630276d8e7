"""See what the model sees: HTML views of CoA trajectories, SFT masks and training curves.

    from coa_lab.viz.trajectory import show_trajectory  # one trajectory, coloured by agent role
    from coa_lab.viz.browser import TrajectoryBrowser    # page through a file, filter by source/validity
    from coa_lab.viz.sft_mask import mask_html           # which tokens the loss sees
    from coa_lab.viz.plots import plot_curves            # training curves (also plot_bars, save_figure)

style.py holds the colours and HTML pieces they share. Importing any of them runs this
package's `_show_figures_inline`, so a notebook displays the plots' bare Figures as images.
"""


def _show_figures_inline() -> None:
    """Let a notebook show a bare matplotlib Figure (what the plot helpers return) as an image.

    The inline backend registers IPython's PNG formatter only when pyplot is imported, which the
    lab never does (pyplot's global state would show each figure twice); without this a Figure
    displays as "<Figure size 640x320>" in JupyterLab (caught by tests/e2e/test_jupyterlab.py)."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats
    except ImportError:  # plain Python: nothing to display into
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "display_formatter"):
        select_figure_formats(shell, {"png"})


_show_figures_inline()
