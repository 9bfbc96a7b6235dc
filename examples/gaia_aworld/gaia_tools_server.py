"""A small MCP tool server standing in for the GAIA tool server: search, calculate, convert units.

    python gaia_tools_server.py                                   # stdio (AWorld starts it itself)
    python gaia_tools_server.py --transport streamable-http       # http://127.0.0.1:PORT/mcp
    python gaia_tools_server.py --transport sse --port 8931       # http://127.0.0.1:8931/sse

Over HTTP it binds to loopback and prints `serving <url>` once it accepts connections (port 0, the
default, picks a free port). The tools are deterministic and offline: the facts come from the table
below, so GAIA-style questions (look something up, then compute with it) have exact answers.
"""

# No `from __future__ import annotations`: FastMCP 1.10 reads the tools' annotations as classes.
import argparse
import ast
import math
import operator
import socket
import sys
import warnings

# mcp 1.10's settings model trips a harmless warning in newer pydantic-settings.
warnings.filterwarnings("ignore", message="Field 'lifespan' has an incomplete definition")
from mcp.server.fastmcp import FastMCP  # noqa: E402

FACTS = {
    "eiffel tower height": "The Eiffel Tower is 330 metres tall (including antennas).",
    "statue of liberty height": "The Statue of Liberty is 93 metres tall from ground to torch.",
    "moon landing year": "Apollo 11 landed on the Moon in 1969.",
    "python release year": "Python 0.9.0 was released in 1991.",
    "mount everest height": "Mount Everest is 8849 metres tall.",
    "speed of light": "The speed of light in vacuum is 299792 kilometres per second.",
    "planets in the solar system": "The planets are Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune.",
    "largest ocean": "The Pacific Ocean is the largest ocean on Earth.",
}

# metres per unit, for lengths
LENGTHS = {"m": 1.0, "km": 1000.0, "cm": 0.01, "ft": 0.3048, "mi": 1609.344, "in": 0.0254}

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.Pow: operator.pow, ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv,
             ast.USub: operator.neg, ast.UAdd: operator.pos}

server = FastMCP("gaia-tools", log_level="WARNING")


@server.tool()
def search(query: str) -> str:
    """Search a small encyclopedia. Returns the facts whose topics best match the query's words."""
    words = set(query.lower().replace("?", " ").split())
    scores = {topic: len(words & set(topic.split())) for topic in FACTS}
    best = max(scores.values())
    hits = [FACTS[topic] for topic, score in scores.items() if score == best > 0]
    return "\n".join(hits) if hits else f"No results for {query!r}."


@server.tool()
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / // % ** and parentheses), e.g. '330 / 93'."""
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as error:
        return f"Error: {error}"
    return f"{value:g}" if isinstance(value, float) else str(value)


@server.tool()
def convert_units(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a length between m, km, cm, ft, mi and in."""
    if from_unit not in LENGTHS or to_unit not in LENGTHS:
        return f"Error: units must be among {', '.join(LENGTHS)}."
    return f"{value * LENGTHS[from_unit] / LENGTHS[to_unit]:g}"


MAX_DIGITS = 100


def _bounded(value: float) -> float:
    if abs(value) >= 10**MAX_DIGITS:
        raise ValueError("result too large")
    return value


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(left) > 1 and right * math.log10(abs(left)) > MAX_DIGITS:
            raise ValueError("result too large")  # checked before computing: a huge power hangs the server
        return _bounded(OPERATORS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def serve_http(transport: str, host: str, port: int) -> None:
    """Serve over HTTP on a socket bound here, so that port 0 reports the port it got."""
    import anyio
    import uvicorn

    app = server.streamable_http_app() if transport == "streamable-http" else server.sse_app()
    path = server.settings.streamable_http_path if transport == "streamable-http" else server.settings.sse_path
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]

    class Announcing(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            print(f"serving http://{host}:{bound}{path}", flush=True)

    config = uvicorn.Config(app, log_level="warning")
    anyio.run(Announcing(config).serve, [sock])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["stdio", "streamable-http", "sse"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind (HTTP); loopback by default.")
    parser.add_argument("--port", type=int, default=0, help="Port (HTTP); 0 picks a free one.")
    args = parser.parse_args(argv)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        serve_http(args.transport, args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
