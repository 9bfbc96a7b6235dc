"""A workflow whose imports fail because of what is installed: the error names the extra to install.

agenttune's own distribution is a plugin like any other (its `builtins` entry point) and declares
extras (`local` brings peft, `vllm` brings vLLM), so these run against the real installed metadata.
The AgentScope plugin's two lines are checked the same way in its own sessions.
"""

from __future__ import annotations

import importlib.util
import uuid
from importlib.metadata import version
from pathlib import Path

import pytest

from agenttune.config.install_hints import extras_for
from agenttune.config.references import load_reference
from agenttune.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def failing_reference(tmp_path: Path, imports: str) -> UserError:
    module = f"workflow_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(f"{imports}\n\nclass MyWorkflow:\n    pass\n", encoding="utf-8")
    with pytest.raises(UserError) as raised:
        load_reference(f"{module}:MyWorkflow", key="workflow", search_path=tmp_path)
    return raised.value


def test_a_name_the_installed_version_lacks_names_the_version_and_the_extra(tmp_path):
    error = failing_reference(tmp_path, "from peft import ReActAgent")
    assert "workflow: importing" in error.message and "ImportError: cannot import name 'ReActAgent'" in error.message
    assert f"peft {version('peft')} is installed" in error.hint
    assert f"`pip install -e '{ROOT}[local]'` (peft<0.22,>=0.12)" in error.hint  # this checkout is an editable install


def test_a_missing_package_an_extra_brings_names_the_extra(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    error = failing_reference(tmp_path, "import vllm")
    assert "needs 'vllm', which is not installed" in error.message
    assert "vllm is not installed" in error.hint and f"`pip install -e '{ROOT}[vllm]'`" in error.hint


def test_a_missing_package_no_plugin_knows_gets_the_plain_hint(tmp_path):
    error = failing_reference(tmp_path, "import no_such_package_anywhere")
    assert "needs 'no_such_package_anywhere', which is not installed" in error.message
    assert error.hint == "Install the package that provides 'no_such_package_anywhere'."


def test_a_misspelt_workflow_module_is_still_a_spelling_problem(tmp_path):
    with pytest.raises(UserError, match="cannot import module 'no_such_module'") as raised:
        load_reference("no_such_module:MyWorkflow", key="workflow", search_path=tmp_path)
    assert "Check the spelling" in raised.value.hint


def test_only_extras_count_not_plain_requirements():
    assert [offer.extra for offer in extras_for("peft")] == ["local"]
    assert extras_for("pydantic") == []  # a plain dependency of agenttune: no extra brings another version
