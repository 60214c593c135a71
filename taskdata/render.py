"""Prompt rendering, in one place: a task becomes the token ids the engine generates from — the same ids
the learner trains on (it checks every group's prompt against them) and evaluation samples from.

With a chat template (`data.chat_template`: the tokenizer's own by default, used when it has one; or a Jinja
template given in the config, for a model that has none):
the task's messages — or one user message, `data.prompt_format` of its text — after an optional system
message (`data.system_prompt`), through `apply_chat_template(..., add_generation_prompt=True)`; the text is
then tokenized without adding special tokens (the template holds them). Without a template: the system
prompt (if any) and the formatted text, tokenized as vLLM tokenizes a text prompt (special tokens added); a
row of chat messages is refused unless `data.chat_template = "plain"`, which renders its messages' text.

Reading a completion back (`answer_region`): with `data.reasoning_end` (e.g. "</think>") only the text after
its first occurrence is scored; a completion that never closes its reasoning is "wrong" or scored whole
(`data.unclosed_reasoning`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from config.data import DataConfig
from verifiers.base import Task

log = logging.getLogger("brorl.data")


TEMPLATE_FIX = ("set data.chat_template to a Jinja template or the path of a .jinja file, or to \"plain\" to "
                "render the messages as plain text")


class RenderError(ValueError):
    """A task cannot be rendered for this model (chat messages without a chat template, too long, ...)."""


@dataclass(frozen=True)
class Rendered:
    text: str
    """The prompt as the model reads it (template applied)."""
    ids: list[int]
    """Its token ids: what the engine generates from."""


class PromptRenderer:
    def __init__(self, tokenizer, data: DataConfig, max_prompt_tokens: int | None = None):
        self.tok, self.data, self.max_prompt_tokens = tokenizer, data, max_prompt_tokens
        ct = data.chat_template
        # the template used: the config's own Jinja text, else the tokenizer's (chat_template = true)
        self.template = ct if isinstance(ct, str) and ct != "plain" else (
            getattr(tokenizer, "chat_template", None) if ct is True else None)
        self.templated = bool(self.template)
        if ct is True and not self.templated:
            log.info("the tokenizer has no chat template: prompts are rendered as plain text (data.prompt_format)")

    @classmethod
    def for_model(cls, model_path: str, data: DataConfig, max_prompt_tokens: int | None = None) -> "PromptRenderer":
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(model_path), data, max_prompt_tokens)

    def messages(self, task: Task) -> list[dict[str, str]]:
        d = self.data
        msgs = [{"role": r, "content": c} for r, c in task.messages] or [
            {"role": "user", "content": d.prompt_format.format(prompt=task.prompt)}]
        if d.system_prompt and msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": d.system_prompt})
        return msgs

    def render(self, task: Task) -> Rendered:
        d = self.data
        if self.templated:
            try:
                text = self.tok.apply_chat_template(self.messages(task), tokenize=False, add_generation_prompt=True,
                                                    chat_template=self.template)
            except Exception as e:  # jinja2's TemplateError and what a template raises itself
                raise RenderError(f"task {task.task_id}: the chat template fails ({type(e).__name__}: {e})") from None
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
        else:
            if task.messages and d.chat_template != "plain":
                raise RenderError(f"task {task.task_id}: its prompt is chat messages and "
                                  + ("the model's tokenizer has no chat template" if d.chat_template else
                                     "data.chat_template = false") + f": {TEMPLATE_FIX}")
            own_system = bool(task.messages) and task.messages[0][0] == "system"
            body = ("\n\n".join(c for _, c in task.messages) if task.messages
                    else d.prompt_format.format(prompt=task.prompt))
            text = (d.system_prompt + "\n" if d.system_prompt and not own_system else "") + body
            ids = self.tok(text)["input_ids"]
        if not ids:
            raise RenderError(f"task {task.task_id}: the rendered prompt has no tokens")
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise RenderError(f"task {task.task_id}: the prompt has {len(ids)} tokens, more than the "
                              f"{self.max_prompt_tokens} that actor.max_model_len leaves for it")
        return Rendered(text, list(ids))


def answer_region(completion: str, reasoning_end: str, unclosed: str) -> str | None:
    """The part of a completion its verifier scores: after the first `reasoning_end` (if set); None when the
    reasoning never closes and `unclosed` is "wrong"."""
    if not reasoning_end:
        return completion
    head, sep, tail = completion.partition(reasoning_end)
    if sep:
        return tail
    return completion if unclosed == "score" else None
