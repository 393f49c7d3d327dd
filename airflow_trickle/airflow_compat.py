"""What differs between the Airflow versions the provider supports (3.2 to 3.3), in one place."""
from __future__ import annotations


def deadline_alert(**arguments):
    """A ``DeadlineAlert`` of ``arguments``; its ``name`` (shown in the UI since Airflow 3.3)
    left out where the class takes none (3.2)."""
    import inspect

    from airflow.sdk import DeadlineAlert

    if "name" not in inspect.signature(DeadlineAlert.__init__).parameters:
        arguments.pop("name", None)
    return DeadlineAlert(**arguments)
