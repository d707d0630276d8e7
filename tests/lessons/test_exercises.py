"""The lessons' self-checking exercises (coa_lab/lessons/exercises): the checks judge, and every notebook's
exercise cells have a registered check and a collapsed solution. That each solution passes its
check and a near-miss fails it, with the lesson's own objects, is run after each notebook's smoke
run (tests/e2e/test_notebooks.py)."""

import inspect

import nbformat
import pytest

from coa_lab.lessons.exercises import EXERCISES, Verdict, check, wrong_answer
from coa_lab.lessons.exercises.notebook_cells import check_calls, self_test_cells, solutions
from coa_lab.paths import PROJECT_ROOT

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _context_free(ex) -> bool:
    return all(p.default is not inspect.Parameter.empty for p in inspect.signature(ex.truth).parameters.values())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_a_registered_check_and_a_solution(path):
    nb = nbformat.read(path, as_version=4)
    calls, sols = check_calls(nb), solutions(nb)
    assert len(calls) >= 2, f"{path.name}: at least two exercises that check themselves"
    assert set(calls) == set(sols), f"{path.name}: checks without a solution or solutions without a check"
    for ex_id in calls:
        assert ex_id in EXERCISES, f"{path.name}: {ex_id} is not registered in coa_lab/lessons/exercises"
        assert ex_id.startswith(path.name[:2] + "."), f"{path.name}: {ex_id} belongs to another lesson"
    assert len(self_test_cells(nb)) == len(calls)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    first_check = next(i for i, src in enumerate(code) if "check(" in src)
    assert any("from coa_lab.lessons.exercises import check" in src for src in code[:first_check]), \
        f"{path.name}: `check` is imported before the first exercise uses it"


def test_every_registered_exercise_is_in_its_lesson():
    used = {ex_id for path in NOTEBOOKS for ex_id in check_calls(nbformat.read(path, as_version=4))}
    assert set(EXERCISES) == used, f"registered but in no lesson: {set(EXERCISES) - used}"


@pytest.mark.parametrize("ex_id", sorted(i for i, ex in EXERCISES.items() if _context_free(ex)))
def test_context_free_checks_accept_the_truth_and_reject_a_near_miss(ex_id):
    ex = EXERCISES[ex_id]
    assert check(ex_id, ex.truth()).ok
    assert not check(ex_id, wrong_answer(ex_id)).ok
    assert "Hint" in check(ex_id, wrong_answer(ex_id)).message


def test_unanswered_unknown_and_malformed_answers():
    v = check("04.clip", None)
    assert not v and "not answered yet" in v.message and EXERCISES["04.clip"].question in v.message
    with pytest.raises(KeyError, match="04.clip"):
        check("04.nope", 1)
    v = check("04.advantages", "four numbers")  # the wrong kind of answer: not yet, no traceback
    assert not v.ok and "Hint" in v.message
    assert check("04.advantages", [1.7320, -0.5773, -0.5773, -0.5773]).ok  # 3-4 decimals do
    assert "right" in Verdict(True, "04.x: right.")._repr_html_() and not Verdict(False, "x")


def test_tensor_answers_are_accepted():
    import torch

    assert check("04.advantages", torch.tensor([1.7320, -0.5773, -0.5773, -0.5773])).ok
    mask, adv = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]), torch.tensor([0.0, 1.0, -1.0])
    ratio = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.5, 1.2, 0.5], [0.7, 1.0, 1.0, 1.0]])
    clip = {"clip_low": 0.2, "clip_high": 0.28}
    # row 0: advantage 0, nothing; row 1: 1.5 is cut, 0.5 is not (a positive advantage is never cut below);
    # row 2: 0.7 is cut (a negative advantage below 0.8)
    assert check("04.grad_tokens", torch.tensor([0, 3, 1]), loss_mask=mask, adv=adv, ratio=ratio, **clip).ok
    assert not check("04.grad_tokens", [0, 4, 2], loss_mask=mask, adv=adv, ratio=ratio, **clip).ok  # clip ignored
    assert not check("04.grad_tokens", 4, loss_mask=mask, adv=adv, ratio=ratio, **clip).ok


# ---- the 03 checks: an answer the lesson already prints or holds does not pass ----

@pytest.fixture(scope="module")
def tok():
    from coa_lab.config import ModelConfig
    from coa_lab.generation.models import load_tokenizer

    return load_tokenizer(ModelConfig().name)  # the embedded model's tokenizer (offline)


def _record(n: int, text: str):
    from coa_lab.trajectories import TrajectoryRecord

    return TrajectoryRecord(id=f"t{n}", task_id=f"lookup-{n}", source="teacher", profile="mhqa",
                            question="Who directed Mr. Arkadin?", answers=["Orson Welles"], text=text, reward=1.0)


ONE = ("<plan>Search.</plan>\n<wiki_search>Mr. Arkadin</wiki_search>\n<observation>(1) Mr. Arkadin: a 1955 film "
       "directed by Orson Welles.</observation>\n<think>Welles.</think>\n<answer>Orson Welles</answer>")
TWO = ("<plan>Search twice.</plan>\n<wiki_search>Arkadin</wiki_search>\n<observation>(1) Arkadin: a name."
       "</observation>\n<wiki_search>Mr. Arkadin film</wiki_search>\n<observation>(1) Mr. Arkadin: a 1955 film "
       "written and directed by Orson Welles, shot in Spain.</observation>\n<think>Welles.</think>\n"
       "<answer>Orson Welles</answer>")


def test_03_masked_split_counts_each_block_of_the_busiest_trajectory(tok):
    from coa_lab.training.sft import encode_example, record_messages

    records = [_record(0, ONE), _record(1, TWO), _record(2, ONE)]
    blocks = EXERCISES["03.masked_split"].truth(records=records, tok=tok)
    assert len(blocks) == 2 and blocks[1] > blocks[0] > 0
    enc = encode_example(tok, record_messages(records[1]), TWO)
    assert sum(blocks) == enc["n_observation_tokens"]
    assert check("03.masked_split", blocks, records=records, tok=tok).ok
    assert not check("03.masked_split", enc["n_observation_tokens"], records=records, tok=tok).ok  # the printed total
    assert not check("03.masked_split", [sum(blocks)], records=records, tok=tok).ok


def test_03_trained_tokens_asks_per_example_not_the_epoch_total(tok):
    from coa_lab.config import get_preset
    from coa_lab.training.sft import IGNORE_INDEX, encode_example, record_messages

    preset, records = get_preset("cpu-smoke"), [_record(0, ONE), _record(1, TWO)]
    per = [sum(label != IGNORE_INDEX for label in encode_example(tok, record_messages(r), r.text,
                                                                 preset.sft.max_length)["labels"]) for r in records]
    context = {"records": records, "tok": tok, "preset": preset}
    assert check("03.trained_tokens", [max(per), min(per)], **context).ok
    assert not check("03.trained_tokens", sum(per), **context).ok  # result.trained_tokens, echoed
    assert not check("03.trained_tokens", [sum(per), sum(per)], **context).ok


def test_03_loss_by_hand_asks_per_example_not_the_batch_mean():
    import types

    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(11, 11)

        def forward(self, input_ids, attention_mask=None):
            return types.SimpleNamespace(logits=self.emb(input_ids))

    batch = {"input_ids": torch.tensor([[1, 2, 3, 4, 0], [5, 6, 7, 8, 9]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
             "labels": torch.tensor([[-100, -100, 3, 4, -100], [-100, 6, 7, 8, 9]])}
    model = Tiny()
    right = EXERCISES["03.loss_by_hand"].truth(model=model, batch=batch)
    logits = model(batch["input_ids"]).logits[:, :-1]
    mean = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), batch["labels"][:, 1:].reshape(-1),
                                             ignore_index=-100).item()  # what the lesson prints as loss_padded
    assert abs((2 * right[0] + 4 * right[1]) / 6 - mean) < 1e-5  # weighted by their labelled tokens
    assert check("03.loss_by_hand", right, model=model, batch=batch).ok
    assert not check("03.loss_by_hand", mean, model=model, batch=batch).ok
    assert not check("03.loss_by_hand", [mean, mean], model=model, batch=batch).ok
