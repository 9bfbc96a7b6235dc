"""GSM8K's first two train rows (`openai/gsm8k`, subset `main`), for tests that must not download it.

Each row has GSM8K's columns: `question`, and `answer`, a worked solution (with `<<...>>` calculator
annotations) whose last line is `#### N`. Readers, `agenttune data` and the math judges are tested on them.
"""

from __future__ import annotations

GSM8K_ROWS = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
               "altogether in April and May.\n#### 72"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                 "How much did she earn?",
     "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
               "$<<0.2*50=10>>10.\n#### 10"},
]
