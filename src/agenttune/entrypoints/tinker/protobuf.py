"""The SDK's protobuf wire format, read and written with the SDK's own generated classes.

The SDK sends `forward_backward` requests as protobuf (optionally zstd-compressed) and accepts only
protobuf for forward/backward and sample results; the schema ships inside the SDK
(`tinker.proto.tinker_public_pb2`), imported here on first use so that the CLI stays light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agenttune.entrypoints.tinker.futures import TinkerError

FLOAT32, INT64, INT32, BFLOAT16 = 1, 2, 3, 4  # tinker_public_pb2.DType
NUMPY = {FLOAT32: np.float32, INT64: np.int64, INT32: np.int32}
STOP, LENGTH = 0, 1  # tinker_public_pb2.StopReason


def _pb() -> Any:
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


@dataclass
class Datum:
    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # loss_fn_inputs, dense


@dataclass
class ForwardBackwardRequest:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


@dataclass
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool  # a stop token or string ended it (else max_tokens did)


def read_forward_backward(body: bytes, encoding: str | None) -> ForwardBackwardRequest:
    if encoding == "zstd":
        import zstandard

        body = zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 31)
    elif encoding not in (None, "", "identity"):
        raise TinkerError(f"Content-Encoding {encoding!r} is not supported (send identity or zstd).", 415)
    message = _pb().ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise TinkerError(f"The forward_backward body is not a ForwardBackwardRequest protobuf ({error}).") from None
    config: dict[str, float | str] = dict(message.loss_fn_config)
    for key, value in message.loss_fn_config_v2.items():  # v2 wins: it also carries strings
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    return ForwardBackwardRequest(message.model_id, message.seq_id, message.loss_fn, config,
                                  message.forward_only, [_datum(datum) for datum in message.data])


def _datum(message: Any) -> Datum:
    tokens: list[int] = []
    for chunk in message.model_input:
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise TinkerError("Only text model inputs (encoded_text chunks) are served; this model takes no "
                              "images or audio.")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    return Datum(tokens, {name: _tensor(tensor) for name, tensor in message.loss_fn_inputs.items()})


def _tensor(message: Any) -> np.ndarray:
    dtype = NUMPY.get(message.dtype)
    if dtype is None:
        raise TinkerError(f"Tensor dtype {message.dtype} is not supported (float32 or int64).")
    if message.WhichOneof("encoding") == "sparse_csr":
        raise TinkerError("Sparse loss_fn_inputs are not served yet; send dense tensors.")
    array = np.frombuffer(message.dense, dtype=dtype).copy()
    shape = list(message.shape)
    return array.reshape(shape) if shape else array


def write_forward_backward(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A ForwardBackwardOutput: one ArrayRecord whose fields batch every datum's arrays end to end."""
    pb = _pb()
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        message.metrics[key] = float(value)
    record = message.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(outputs))
    for name in (outputs[0] if outputs else {}):
        arrays = [np.ascontiguousarray(output[name], dtype=np.float32) for output in outputs]
        offsets = np.cumsum([0, *(array.nbytes for array in arrays)], dtype=np.int64)
        batched = record.fields[name]
        batched.data = b"".join(array.tobytes() for array in arrays)
        batched.offsets = offsets.tobytes()
        batched.dtype = FLOAT32
    return message.SerializeToString()


def write_sample(sequences: list[SampledSequence], prompt_logprobs: list[float] | None) -> bytes:
    """A SampleResponse; prompt log-probs start with NaN (the first token has no context)."""
    pb = _pb()
    message = pb.SampleResponse()
    for sequence in sequences:
        message.sequences.add(stop_reason=STOP if sequence.stopped else LENGTH,
                              tokens=np.asarray(sequence.tokens, dtype=np.int32).tobytes(),
                              logprobs=np.asarray(sequence.logprobs, dtype=np.float32).tobytes())
    if prompt_logprobs is not None:
        values = [math.nan, *prompt_logprobs[1:]]
        message.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    return message.SerializeToString()
