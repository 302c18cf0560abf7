"""web/engine/loader.js's weight writes run in Node against a fake GPU queue: every piece lands at its
buffer offset (a tensor's odd tail padded to a word), and the queue is drained after each `flushBytes`
written and at the end, so a multi-GB model's writes never pile up in staging memory (the browser tests
load real models through the same function, below the flush size)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOADER_JS = (ROOT / "web" / "engine" / "loader.js").as_uri()

SCRIPT = """
const { writePieces, FLUSH_BYTES } = await import(process.argv[1]);
const log = [];
const buffers = [new Uint8Array(6000), new Uint8Array(4000)];
const device = {queue: {
  writeBuffer(buffer, offset, data, dataOffset = 0, size = data.length - dataOffset) {
    if (offset % 4 || size % 4) throw new Error(`unaligned write ${offset}+${size}`);
    buffer.set(data.subarray(dataOffset, dataOffset + size), offset);
    log.push(["write", size]);
  },
  async onSubmittedWorkDone() { log.push(["drain"]); },
}};
// two tensors: 5001 bytes at 800 of buffer 0 (an odd tail), 3000 at 0 of buffer 1, in pieces of up to 1000
const slices = [{buffer: buffers[0], bufferOffset: 800, size: 5001, fill: 7}, {buffer: buffers[1], bufferOffset: 0, size: 3000, fill: 9}];
async function* pieces() {
  for (const slice of slices) {
    for (let at = 0; at < slice.size; at += 1000) {
      const bytes = new Uint8Array(Math.min(1000, slice.size - at)).map((_, i) => (slice.fill + at + i) % 251);
      yield {slice, at, bytes};
    }
  }
}
let reported = 0;
await writePieces(device, pieces(), (n) => { reported += n; }, 2500);
const expect = (slice, i) => (slice.fill + i) % 251;
console.log(JSON.stringify({
  flushBytes: FLUSH_BYTES, reported, log,
  landed: slices.every((s) => s.buffer.subarray(s.bufferOffset, s.bufferOffset + s.size).every((b, i) => b === expect(s, i))),
  untouched: buffers[0].subarray(0, 800).every((b) => b === 0) && buffers[0][5801] === 0 && buffers[1][3000] === 0,
}));
"""


def test_weight_writes_land_and_drain_the_queue_every_flush_bytes():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the browser tests load models through the same function)")
    out = json.loads(subprocess.run([node, "--input-type=module", "-e", SCRIPT, LOADER_JS], capture_output=True,
                                    text=True, check=True, timeout=60).stdout)
    assert out["flushBytes"] == 256 << 20
    assert out["landed"] and out["untouched"]
    assert out["reported"] == 8001
    # pieces of 1000, 1000, 1000 | 1000, 1000, 1 (its write a padded word), then the second tensor's 1000 |
    # 1000, 1000: the queue drained once 2500 or more bytes are written since the last drain, and at the end
    drains = [i for i, entry in enumerate(out["log"]) if entry == ["drain"]]
    written_between = [sum(e[1] for e in out["log"][a + 1:b] if e[0] == "write") for a, b in zip([-1] + drains, drains)]
    assert written_between == [3000, 3004, 2000], out["log"]
    assert drains[-1] == len(out["log"]) - 1
