"""run_node gets the channel attacks run_python gets (tests/security/test_channel.py, test_gvisor.py): tool code
in JavaScript can neither write answers to the worker's stdout nor open any other process's descriptors,
nor read PID 1's environment or memory. Under runc and gVisor (the suite's second pass, TOOLCAGE_SANDBOX=gvisor).
"""

from __future__ import annotations

import json

import pytest

from toolcage import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")

# every other process's descriptors, opened for writing (the channel is the worker's fd 0 and 1)
OPEN_OTHER_FDS = r"""
const fs = require('fs');
const opened = [], refused = new Set();
const forged = JSON.stringify({jsonrpc: '2.0', id: 1, result: {stdout: 'FORGED'}}) + '\n';
const others = fs.readdirSync('/proc').filter(p => /^\d+$/.test(p) && Number(p) !== process.pid);
for (const pid of new Set([...others, '1'])) {
  if (Number(pid) === process.pid) continue;
  let fds = [];
  try { fds = fs.readdirSync(`/proc/${pid}/fd`); } catch (e) { refused.add(e.code); continue; }
  for (const fd of fds) {
    try {
      const f = fs.openSync(`/proc/${pid}/fd/${fd}`, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
      fs.writeSync(f, forged); fs.closeSync(f); opened.push(`${pid}/${fd}`);
    } catch (e) { refused.add(e.code); }
  }
}
const read = {};
for (const what of ['environ', 'mem', 'cmdline']) {
  try { read[what] = fs.readFileSync(`/proc/1/${what}`).length; } catch (e) { read[what] = e.code; }
}
console.log(JSON.stringify({pid: process.pid, opened, read}));
"""


def test_node_code_cannot_reach_the_workers_channel_or_proc_1() -> None:
    """No other process's descriptor opens (no forged answer reaches the runner); PID 1's environ and
    memory do not read. Under gVisor node is PID 1 of a PID namespace of its own, with no other process."""
    with Sandbox(audit=False) as sb:
        r = sb.call("run_node", {"code": OPEN_OTHER_FDS})
        assert r.ok and "FORGED" not in r.result["stdout"], r
        seen = json.loads(r.result["stdout"])
        assert seen["opened"] == [], seen
        if sb.kind == "gvisor":
            assert seen["pid"] == 1, seen  # /proc/1 is node itself there
        else:
            assert seen["read"]["environ"] == "EACCES" and seen["read"]["mem"] == "EACCES", seen
        assert sb.call("ping").result == "pong"
        assert sb.call("run_node", {"code": "console.log('real')"}).result["stdout"] == "real\n"
