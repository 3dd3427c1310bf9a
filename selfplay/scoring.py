"""Log-probabilities of given responses under a causal LM: what the learner trains through,
and what exploitability probes read a model's move probabilities from."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def response_logprobs(
    model, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], temperature: float = 1.0
) -> list[torch.Tensor]:
    """log softmax(logits / T) of each response token given its prompt, one tensor per pair.

    The batch is right-padded, so positions count from 0 in every row exactly as they did when
    the response was sampled. Gradients flow when the caller has them enabled.
    """
    device = next(model.parameters()).device
    lengths = [len(p) + len(r) - 1 for p, r in zip(prompts, responses)]
    width = max(lengths)
    input_ids = torch.zeros((len(prompts), width), dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        sequence = [*prompt, *response][:-1]
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention_mask[row, : len(sequence)] = 1
    hidden = model.get_decoder()(
        input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)
    ).last_hidden_state
    rows, cols, targets = [], [], []
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        rows += [row] * len(response)
        cols += range(len(prompt) - 1, len(prompt) - 1 + len(response))
        targets += response
    # The output head runs on response positions only: on long prompts it is most of the cost.
    logits = model.get_output_embeddings()(hidden[rows, cols]).float()
    if temperature not in (0, 1):
        logits = logits / temperature
    token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(targets, device=device)[:, None])
    return list(token_logprobs.squeeze(-1).split([len(r) for r in responses]))
