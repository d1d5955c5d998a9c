"""A connector to the GitHub REST API: two read-only tools. The token never enters this code:
``auth="GITHUB_TOKEN"`` has the worker add it, only on requests to the origin github.yaml binds it to."""

import re
from typing import Any, Literal

from toolcage.sdk import Context, ToolError, tool

API = "https://api.github.com"
State = Literal["open", "closed", "all"]
HEADERS = {"Accept": "application/vnd.github+json", "User-Agent": "toolcage-example"}  # no User-Agent: GitHub says 403


def _get(ctx: Context, repo: str, path: str = "", **params: Any) -> Any:
    if not re.fullmatch(r"[\w-]+/(?!\.+$)[\w.-]+", repo):  # the caller is a model: keep it on /repos/OWNER/NAME
        raise ToolError(f"repo must be OWNER/NAME, not {repo!r}")
    r = ctx.fetch(f"{API}/repos/{repo}{path}", params=params, headers=HEADERS, auth="GITHUB_TOKEN")
    return r.raise_for_status().json()  # an HTTP error becomes the call's tool error (-32001)


@tool
def list_issues(ctx: Context, repo: str, state: State = "open", limit: int = 20) -> list[dict[str, Any]]:
    """List a GitHub repository's issues (pull requests left out), newest first.

    Args:
        repo: the repository, as OWNER/NAME
        state: which issues: open, closed or all
        limit: how many to fetch, 1 to 100
    """
    issues = _get(ctx, repo, "/issues", state=state, per_page=min(max(limit, 1), 100))
    return [{"number": i["number"], "title": i["title"]} for i in issues if "pull_request" not in i]


@tool
def get_repo(ctx: Context, repo: str) -> dict[str, Any]:
    """Describe a GitHub repository: description, default branch, stars, open issues.

    Args:
        repo: the repository, as OWNER/NAME
    """
    r = _get(ctx, repo)
    keys = ("full_name", "description", "default_branch", "stargazers_count", "open_issues_count")
    return {k: r.get(k) for k in keys}
