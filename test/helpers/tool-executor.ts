// A small reference tool executor (the `datasets[].toolExecutor` protocol of docs/agentic.md) on
// 127.0.0.1: it answers each call with a deterministic result, keeps its answers by the request's
// Idempotency-Key so that a request sent again runs nothing again, and counts what it received.
// Knobs make it slow, hang, or fail, for the fault tests.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ExecutorCall {
  id: string;
  name: string;
  arguments: unknown;
}

export interface ExecutorRequest {
  key: string;
  dataset: string;
  conversation_id: string;
  turn: number;
  calls: ExecutorCall[];
}

export interface ReferenceExecutor {
  url: string;
  /** Every request received, in order (a repeated key included). */
  requests: ExecutorRequest[];
  /** How many times each key's calls were run: 1 each when nothing ran twice. */
  executions: Map<string, number>;
  /** The results given for each key. */
  answers: Map<string, { tool_call_id: string; content: string }[]>;
  /** Answers the next `n` requests with `status` (after running nothing). */
  failNext(n: number, status: number): void;
  /** Holds every answer this long (ms) after running the calls; 0: at once. */
  setDelay(ms: number): void;
  close(): Promise<void>;
}

/** What the executor answers for a call: its name, arguments and where it was made. */
export function resultFor(call: ExecutorCall, conversationId: string, turn: number): string {
  return `ran ${call.name}(${JSON.stringify(call.arguments)}) for ${conversationId} turn ${turn}: ok`;
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

export async function startReferenceExecutor(): Promise<ReferenceExecutor> {
  const requests: ExecutorRequest[] = [];
  const executions = new Map<string, number>();
  const answers = new Map<string, { tool_call_id: string; content: string }[]>();
  let failing = 0;
  let failStatus = 500;
  let delayMs = 0;
  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const body = JSON.parse(await readBody(req)) as Omit<ExecutorRequest, 'key'>;
    const key = String(req.headers['idempotency-key'] ?? '');
    requests.push({ ...body, key });
    if (failing > 0) {
      failing -= 1;
      res.writeHead(failStatus, { 'content-type': 'application/json' }).end('{"error":"refused on purpose"}');
      return;
    }
    let results = answers.get(key);
    if (results === undefined) {
      results = body.calls.map((c) => ({ tool_call_id: c.id, content: resultFor(c, body.conversation_id, body.turn) }));
      answers.set(key, results);
      executions.set(key, (executions.get(key) ?? 0) + 1);
    }
    if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ results }));
  };
  const server: Server = createServer((req, res) => {
    handle(req, res).catch((e: unknown) => {
      res.writeHead(500).end(String(e));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/execute`,
    requests,
    executions,
    answers,
    failNext: (n, status) => {
      failing = n;
      failStatus = status;
    },
    setDelay: (ms) => {
      delayMs = ms;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
