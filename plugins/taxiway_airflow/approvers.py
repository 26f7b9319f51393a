"""Who may answer an approval, as user ids: Airflow checks an answer against the task's assigned user
ids only (``is_authorized_hitl_task``), so a ``role:NAME`` entry of ``registry.approvers`` is expanded
to the users holding that role where the task asks, and again where the decision checks the answer."""

from __future__ import annotations

from airflow.configuration import conf

from pipelines.config import ConfigError

ROLE = "role:"


def people(approvers: list[str]) -> list[str]:
    """``approvers`` with each ``role:NAME`` replaced by its users (in the auth manager's order); empty
    only when ``approvers`` is. A role that names no one is refused: an empty list of assigned users
    would let anyone answer."""
    users = [a for a in approvers if not a.startswith(ROLE)]
    roles = [a[len(ROLE):] for a in approvers if a.startswith(ROLE)]
    if not roles:
        return users
    holders = _by_role()
    if empty := [r for r in roles if not holders.get(r.lower())]:
        raise ConfigError({"registry.approvers": f"role {', '.join(repr(r[:64]) for r in empty)}: no user holds it; "
                                                 "an approval with no approver would be anyone's to answer"}, "config")
    return users + [u for r in roles for u in holders[r.lower()] if u not in users]


def _by_role() -> dict[str, list[str]]:
    """Users by role (lower case) as the auth manager lists them; SimpleAuthManager's list is the
    deployment's ``[core] simple_auth_manager_users``. Another auth manager keeps roles where this task
    cannot read them, so its approvers are user ids."""
    manager = conf.get("core", "auth_manager")
    if manager.rsplit(".", 1)[-1] != "SimpleAuthManager":
        raise ConfigError({"registry.approvers": f"role entries need the users of each role, which Taxiway reads "
                                                 f"from SimpleAuthManager only; with {manager.rsplit('.', 1)[-1]}, "
                                                 "list user ids"}, "config")
    # the api-server's auth package (FastAPI and its routes): only where a role is expanded
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    out: dict[str, list[str]] = {}
    for user in SimpleAuthManager.get_users():
        out.setdefault((user.role or "").lower(), []).append(user.username)
    return out
