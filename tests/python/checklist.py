"""How the Python test scripts report: one `ok`/`FAIL` line per check, then a summary line and
the exit status ctest reads (1 when any check failed)."""


class Checklist:
    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failures.append(what)

    def exit_status(self):
        print(f"{len(self.failures)} check(s) failed" if self.failures else "all checks passed")
        return 1 if self.failures else 0
