"""Print why the egress proxy refused http://localhost/ (its 403's reason), or what else happened."""

import json
import os
import urllib.error
import urllib.request

if not os.environ.get("HTTP_PROXY"):
    print("no proxy: the sandbox has no network")
else:
    try:
        urllib.request.urlopen("http://localhost/", timeout=10)
        print("reached localhost")
    except urllib.error.HTTPError as exc:
        print(json.loads(exc.read() or b"{}").get("reason", exc.code))
    except OSError as exc:
        print("error:", exc)
