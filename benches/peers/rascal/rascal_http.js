#!/usr/bin/env node
// The Rascal peer of `dlqctl work --http` on the retry path
// (`cargo bench --bench http_retry`, benches/http_retry.rs).
//
// A Rascal subscriber as one writes it from Rascal's README ("Forward"
// recovery and its wait-queue use): a quorum main queue consumed with
// prefetch 100 (or PREFETCH); each message's body is POSTed to HTTP_URL (keep-alive
// agent, `Idempotency-Key` = the message id, as dlqctl sends it). 2xx:
// ack. Anything else: `ackOrNack(err, recovery)` with the `forward`
// strategy to a confirmed publication that targets a quorum wait queue
// whose `x-message-ttl` dead-letters the message back to the main queue
// (the same arguments as a dlqctl tier queue), then nack after 10 forwards.
// Rascal's defaults otherwise; `RASCAL_CONFIRM_POOL_MAX=N` (environment)
// raises its confirm channel pool from 5 to N.
//
//     rascal_http.js AMQP_URL MAIN_QUEUE WAIT_QUEUE DELAY_MS HTTP_URL [PREFETCH]
//
// It declares both queues (Rascal asserts its topology), prints `ready`,
// waits for a line on stdin, subscribes, and runs until SIGTERM or until
// stdin closes. The bench preloads the main queue between `ready` and the
// line, and times the run at the HTTP server.
//
// Install Rascal (pinned in package.json; node_modules is git-ignored):
//     cd benches/peers/rascal && npm install
// or into a scratch folder, then point the bench at it:
//     npm install --prefix /tmp/rascal-peer rascal@21.0.1 amqplib@2.3.1
//     BENCH_RASCAL_DIR=/tmp/rascal-peer cargo bench --bench http_retry

'use strict';

const http = require('http');
const Rascal = require('rascal');

async function main() {
  const [url, mainQueue, waitQueue, delayMs, httpUrl, prefetch = '100'] = process.argv.slice(2);
  if (!httpUrl) {
    console.error('usage: rascal_http.js AMQP_URL MAIN_QUEUE WAIT_QUEUE DELAY_MS HTTP_URL [PREFETCH]');
    process.exit(2);
  }
  const config = {
    vhosts: {
      '/': {
        connection: { url },
        queues: {
          [mainQueue]: {
            options: { durable: true, arguments: { 'x-queue-type': 'quorum' } },
          },
          [waitQueue]: {
            options: {
              durable: true,
              arguments: {
                'x-queue-type': 'quorum',
                'x-message-ttl': Number(delayMs),
                'x-dead-letter-exchange': '',
                'x-dead-letter-routing-key': mainQueue,
                'x-dead-letter-strategy': 'at-least-once',
                'x-overflow': 'reject-publish',
              },
            },
          },
        },
        // Rascal's default confirm pool (at most 5 channels, one publish in
        // flight on each) unless RASCAL_CONFIRM_POOL_MAX says otherwise.
        publicationChannelPools: process.env.RASCAL_CONFIRM_POOL_MAX
          ? { confirmPool: { max: Number(process.env.RASCAL_CONFIRM_POOL_MAX) } }
          : {},
        publications: {
          retry: { queue: waitQueue },
        },
        subscriptions: {
          main: { queue: mainQueue, prefetch: Number(prefetch) },
        },
      },
    },
    recovery: {
      retry: [{ strategy: 'forward', publication: 'retry', attempts: 10 }, { strategy: 'nack' }],
    },
  };

  const broker = await Rascal.BrokerAsPromised.create(Rascal.withDefaultConfig(config));
  let stopping = false;
  broker.on('error', (err) => stopping || console.error('broker error:', err.message));
  const stop = async () => {
    stopping = true;
    try {
      await broker.shutdown();
    } finally {
      process.exit(0);
    }
  };
  process.on('SIGTERM', stop);

  process.stdout.write('ready\n');
  await new Promise((resolve) => process.stdin.once('data', resolve));
  process.stdin.once('end', stop);

  const agent = new http.Agent({ keepAlive: true });
  const target = new URL(httpUrl);
  const post = (body, id) =>
    new Promise((resolve, reject) => {
      const headers = {
        'Content-Type': 'application/octet-stream',
        'Content-Length': body.length,
      };
      if (id) headers['Idempotency-Key'] = id;
      const req = http.request(target, { method: 'POST', agent, headers }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode));
      });
      req.on('error', reject);
      req.end(body);
    });

  const subscription = await broker.subscribe('main');
  subscription.on('error', (err) => stopping || console.error('subscription error:', err.message));
  subscription.on('message', (message, content, ackOrNack) => {
    post(message.content, message.properties.messageId).then(
      (status) => {
        if (status >= 200 && status < 300) return ackOrNack();
        ackOrNack(new Error(`HTTP ${status}`), broker.config.recovery.retry);
      },
      (err) => ackOrNack(err, broker.config.recovery.retry),
    );
  });
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
