#!/usr/bin/env node
// A dlqctl JSON-lines handler in Node.js (standard library only).
//
//   dlqctl work topology/orders.yaml --queue orders --jsonl \
//       -- node examples/handlers/handler.js
//
// dlqctl writes a hello line, this answers the ready line, then each
// message comes as one JSON line on stdin and gets one answer line on
// stdout, in any order: handle() may be async, and several messages are in
// flight at once (up to the hello's max_in_flight). EOF on stdin means
// "exit". Write diagnostics to stderr: stdout is the protocol.
'use strict';
const readline = require('readline');

// Resolves to {outcome, error?, retry_after?} for one message. Put your
// logic here; a thrown error is a transient failure.
async function handle(msg) {
  if (msg.body === undefined) {
    return { outcome: 'permanent', error: 'the body is not UTF-8 text' };
  }
  let order;
  try {
    order = JSON.parse(msg.body);
  } catch (e) {
    return { outcome: 'permanent', error: `the body is not JSON: ${e.message}` };
  }
  if (order === null || typeof order !== 'object' || Array.isArray(order)) {
    return { outcome: 'permanent', error: 'the body is not a JSON object' };
  }
  if (order.simulate === 'outage') {
    return { outcome: 'transient', error: 'the payment service did not answer (simulated)' };
  }
  if (order.simulate === 'bad-data') {
    return { outcome: 'permanent', error: `order ${order.id} has no customer (simulated)` };
  }
  return { outcome: 'success' };
}

function send(answer) {
  // Writes to a pipe are synchronous on Linux: no unbounded buffering.
  process.stdout.write(JSON.stringify(answer) + '\n');
}

const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
let greeted = false;
lines.on('line', (line) => {
  if (!greeted) {
    greeted = true;
    const hello = JSON.parse(line);
    if (hello.protocol !== 'dlqctl-jsonl' || hello.version !== 1) {
      console.error(`handler.js speaks dlqctl-jsonl/1, got hello ${line}`);
      process.exit(2);
    }
    send({ ready: true, version: 1 });
    return;
  }
  const msg = JSON.parse(line);
  Promise.resolve()
    .then(() => handle(msg))
    .then(
      (result) => send({ id: msg.id, ...result }),
      (e) => send({ id: msg.id, outcome: 'transient', error: String((e && e.message) || e) }),
    );
});
// On EOF the process exits once the answers in flight are written.
