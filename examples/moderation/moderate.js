// A content-moderation backend in Node that has llmq label user posts.
//
// It binds a queue of its own to the llmq.results topic exchange for its
// tenant ("<tenant>.*": every finished job of the tenant), publishes each
// post as a job to the llmq.jobs exchange asking for a JSON answer
// {label, confidence, reason} that fits a JSON Schema, and prints each label
// as its result event arrives. Events are delivered at least once, so it
// dedupes them by event_id. It exits 0 once every post is labelled, 1 after
// the timeout or when a job did not succeed.
//
//   npm ci && npm start            (or: node moderate.js --n 8 --amqp amqp://…)

import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import amqp from 'amqplib';

const { values: opts } = parseArgs({
  options: {
    amqp: { type: 'string', default: process.env.LLMQ_AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672/' },
    tenant: { type: 'string', default: process.env.LLMQ_TENANT ?? 'default' },
    model: { type: 'string', default: 'qwen-plus' },
    n: { type: 'string', default: '6' },
    timeout: { type: 'string', default: '60' }, // seconds
  },
});

// The answer's shape: the model must reply with JSON that fits it.
const labelSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['label', 'confidence', 'reason'],
  properties: {
    label: { type: 'string', enum: ['ok', 'spam', 'abuse', 'adult', 'off_topic'] },
    confidence: { type: 'number', minimum: 0, maximum: 1 },
    reason: { type: 'string', maxLength: 200 },
  },
};

const posts = [
  'Loved the new release, the dark mode is gorgeous.',
  'BUY CHEAP WATCHES NOW!!! Visit my profile for 90% discount codes',
  'You are an idiot and everyone here hates you.',
  'Does anyone know when the Berlin meetup starts?',
  'Check out my crypto channel, guaranteed 10x returns every week',
  'What is your favourite pizza topping? Asking for a friend.',
];

function moderationRequest(text) {
  return {
    messages: [
      { role: 'system', content: 'You moderate posts in a developer forum. Label the post and say why.' },
      { role: 'user', content: text },
    ],
    max_tokens: 150,
    response_format: { type: 'json_schema', json_schema: { name: 'moderation', strict: true, schema: labelSchema } },
  };
}

async function main() {
  const count = Number.parseInt(opts.n, 10);
  const conn = await amqp.connect(opts.amqp);
  const ch = await conn.createConfirmChannel();
  // RabbitMQ closes the channel on an error such as a missing llmq.jobs.
  const fail = (err) => {
    const hint = err.code === 404 ? ' (is llmq up running with LLMQ_BROKER=rabbitmq on this RabbitMQ?)' : '';
    console.error(`moderate: ${err.message}${hint}`);
    process.exit(1);
  };
  conn.on('error', fail);
  ch.on('error', fail);

  // Listen before publishing, so no result is missed. llmq declares the
  // exchange too; declaring it here (the same way) lets this start first.
  await ch.assertExchange('llmq.results', 'topic', { durable: true });
  const { queue } = await ch.assertQueue('', { exclusive: true });
  await ch.bindQueue(queue, 'llmq.results', `${opts.tenant}.*`);

  const run = randomUUID().slice(0, 8);
  const pending = new Map(); // job id -> post
  const seen = new Set(); // event ids
  let failed = 0;
  let finish;
  const done = new Promise((resolve) => { finish = resolve; });

  await ch.consume(queue, (msg) => {
    let event;
    try {
      event = JSON.parse(msg.content.toString());
    } catch {
      console.error(`skipping a message that is not JSON: ${msg.content.toString().slice(0, 200)}`);
      return;
    }
    const job = event.data;
    // The binding sees every job of the tenant: keep to this run's.
    if (event.version !== 1 || seen.has(event.event_id) || !pending.has(job?.id)) return;
    seen.add(event.event_id);
    pending.delete(job.id);
    if (job.status === 'succeeded') {
      const answer = JSON.parse(job.response.choices[0].message.content);
      console.log(`${job.id} label=${answer.label} confidence=${answer.confidence} reason=${JSON.stringify(answer.reason)}`);
    } else {
      failed++;
      console.log(`${job.id} ${job.status}: ${job.error?.kind}: ${job.error?.message}`);
    }
    if (pending.size === 0) finish();
  }, { noAck: true });

  // A post nobody routes (llmq not running on this RabbitMQ) comes back.
  ch.on('return', (msg) => {
    console.error(`llmq.jobs routed ${msg.properties.messageId} nowhere: is llmq up running with RabbitMQ?`);
    process.exit(1);
  });
  for (let i = 0; i < count; i++) {
    // The job id is unique per run: llmq processes an id once.
    const job = {
      id: `mod-${run}-${i + 1}`,
      tenant: opts.tenant,
      model: opts.model,
      request: moderationRequest(posts[i % posts.length]),
      metadata: { post: i + 1 },
    };
    pending.set(job.id, posts[i % posts.length]);
    // Routing key = priority; persistent and mandatory, as llmq's clients publish.
    ch.publish('llmq.jobs', 'normal', Buffer.from(JSON.stringify(job)), {
      persistent: true, mandatory: true, messageId: job.id, contentType: 'application/json',
    });
  }
  await ch.waitForConfirms();
  console.log(`sent ${count} posts; labels arrive on llmq.results (${opts.tenant}.*)`);

  const timer = setTimeout(finish, Number(opts.timeout) * 1000);
  await done;
  clearTimeout(timer);
  await conn.close();
  if (pending.size > 0) {
    console.error(`${pending.size} of ${count} labels missing after ${opts.timeout}s`);
    return 1;
  }
  if (failed > 0) {
    console.error(`${failed} of ${count} posts were not labelled`);
    return 1;
  }
  console.log(`all ${count} posts labelled`);
  return 0;
}

main().then((code) => { process.exitCode = code; }, (err) => {
  console.error(`moderate: ${err.message}`);
  process.exitCode = 1;
});
