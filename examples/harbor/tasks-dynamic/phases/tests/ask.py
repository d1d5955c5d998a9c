"""Print why the egress proxy refused http://allowed.example:8080/ (its 403's reason), or what else happened.

The proxy checks the name, then the scheme and port, and only then looks the name up: a port no rule opens is
refused before any lookup, so nothing leaves the machine whatever the policy.
"""

import json
import os
import urllib.error
import urllib.request

if not os.environ.get("HTTP_PROXY"):
    print("no proxy: the sandbox has no network")
else:
    try:
        urllib.request.urlopen("http://allowed.example:8080/", timeout=10)
        print("reached allowed.example")
    except urllib.error.HTTPError as exc:
        print(json.loads(exc.read() or b"{}").get("reason", exc.code))
    except OSError as exc:
        print("error:", exc)
