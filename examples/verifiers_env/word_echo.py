"""`word-echo`: a small verifiers 0.4 environment, written as a hub environment is (a taskset package).

The model is asked to say a word back. Two weighted rewards: `exact` (the reply is the word) and
`overlap` (the share of the word's letters the reply has, in order: partial credit that even a random
tiny model earns a little of, so a debug run shows rewards that differ). A metric counts characters.
Installed environments are imported by their id (`word-echo` -> module `word_echo`); this one sits
next to the YAML, which agenttune puts on sys.path.
"""

import random
import string
from difflib import SequenceMatcher

import verifiers.v1 as vf

WORDS = ["apple", "river", "stone", "cloud", "amber", "frost", "maple", "ocean", "tiger", "lemon",
         "piano", "grape", "house", "light", "sugar", "bread"]


class WordEchoConfig(vf.TasksetConfig):
    num_tasks: int = 16
    offset: int = 0  # the held-out split starts elsewhere in the list
    made_up: bool = False  # made-up five-letter words, as many as asked (bench/environments.py), instead of WORDS


def made_up_words(count: int) -> list[str]:
    """The first `count` of a fixed sequence of different made-up five-letter words."""
    rng, words = random.Random(0), dict[str, None]()
    while len(words) < count:
        words["".join(rng.choices(string.ascii_lowercase, k=5))] = None
    return list(words)


class WordData(vf.TaskData):
    answer: str


class WordTask(vf.Task[WordData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.5)
    async def exact(self, trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.reward(weight=0.5)
    async def overlap(self, trace) -> float:
        reply, word = trace.last_reply.strip(), self.data.answer
        return SequenceMatcher(None, reply, word).find_longest_match().size / len(word)

    @vf.metric
    async def reply_chars(self, trace) -> float:
        return float(len(trace.last_reply))


class WordEchoTaskset(vf.Taskset[WordTask, WordEchoConfig]):
    def load(self):
        words = made_up_words(self.config.offset + self.config.num_tasks) if self.config.made_up else WORDS
        for i in range(self.config.num_tasks):
            word = words[(i + self.config.offset) % len(words)]
            yield WordTask(WordData(id=f"word-{i + self.config.offset}", prompt=f"Say {word}", answer=word),
                           self.config.task)


__all__ = ["WordEchoTaskset"]
