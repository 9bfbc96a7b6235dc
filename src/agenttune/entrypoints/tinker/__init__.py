"""A Tinker-compatible server on the local trainer: the `tinker` SDK (0.38) trains and samples here.

    server.py       `agenttune tinker serve`: the model, the state directory, uvicorn
    app.py          the routes under /api/v1, the API key, content-type and body checks
    futures.py      request ids, results, 408 try_again while pending; the one worker thread
    training.py     training clients: forward_backward, optim_step (Adam), save and load
    losses.py       Tinker's losses through agenttune's policy losses
    sampling.py     sampling sessions; sampling through the hf engine, one set of weights at a time
    models.py       the base model and its LoRA adapters (peft)
    checkpoints.py  tinker:// paths as directories under the state directory
    protobuf.py     the SDK's protobuf messages, read and written with its generated classes

Heavy libraries (torch, transformers, peft, tinker) are imported inside functions. See docs/tinker.md.
"""
