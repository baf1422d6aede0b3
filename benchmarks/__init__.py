"""The benchmarks: GPU measurements whose rows go to docs/benchmarks (JSON + PNG).

Not part of the installed package: they run from a checkout, as `python -m benchmarks.loss ...`
from its root or `infcl-ds bench loss ...` (infcl_ds/cli.py finds this folder beside the
package). They import infcl_ds; infcl_ds never imports them but for that dispatch.
"""
