from django.db import models


class Ledger(models.Model):
    """One row each time a test workflow's prepare body reaches a step.

    Tests count these rows to prove that a body ran exactly once.
    """

    kind = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    step = models.CharField(max_length=50, default="done")
    pid = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.kind} {self.key} {self.step}"
