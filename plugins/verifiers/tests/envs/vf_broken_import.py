"""An environment whose own import fails (a dependency it needs is not installed)."""

import a_package_nobody_installed  # noqa: F401
import verifiers.v1 as vf  # noqa: F401
