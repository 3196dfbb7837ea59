// An HTTP proxy in front of the SGLang simulator that answers 500, with SGLang's error body, to
// the generation requests of chosen sample ids (a server that fails some prompts, and only
// those, until their attempts are spent), passes everything else through, and counts the
// generation requests it saw per sample id.
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface PromptFaultProxy {
  url: string;
  /** Sample ids answered 500 (change it at any time). */
  readonly failing: Set<string>;
  /** Generation requests seen per sample id (the rid's part between `/` and `#`), failed or not. */
  requests(id: string): number;
  close(): Promise<void>;
}

/** The message the proxy's 500 carries, as SGLang words an out-of-memory abort. */
export const INJECTED_500_MESSAGE =
  'Out of memory even after retracting all other requests in the decode batch. Aborting the request.';

function sampleIdOf(rid: string): string {
  return rid.slice(rid.indexOf('/') + 1, rid.lastIndexOf('#') < 0 ? undefined : rid.lastIndexOf('#'));
}

export async function startPromptFaultProxy(target: string): Promise<PromptFaultProxy> {
  const failing = new Set<string>();
  const counts = new Map<string, number>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      void (async () => {
        if (req.method === 'POST' && req.url === '/generate') {
          let rid = '';
          try {
            const parsed = JSON.parse(body.toString('utf8')) as { rid?: unknown };
            if (typeof parsed.rid === 'string') rid = parsed.rid;
          } catch {
            // not ours to judge: pass it on
          }
          const id = sampleIdOf(rid);
          counts.set(id, (counts.get(id) ?? 0) + 1);
          if (failing.has(id)) {
            res.writeHead(500, { 'content-type': 'application/json' });
            res.end(
              JSON.stringify({ object: 'error', message: INJECTED_500_MESSAGE, type: '500', param: null, code: 500 }),
            );
            return;
          }
        }
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(req.headers))
          if (typeof v === 'string' && k !== 'host' && k !== 'content-length' && k !== 'connection') headers[k] = v;
        const upstream = await fetch(target + (req.url ?? '/'), {
          method: req.method ?? 'GET',
          headers,
          ...(req.method === 'GET' || req.method === 'HEAD' ? {} : { body }),
        });
        const out = Buffer.from(await upstream.arrayBuffer());
        res.writeHead(upstream.status, { 'content-type': upstream.headers.get('content-type') ?? 'application/json' });
        res.end(out);
      })().catch(() => {
        res.destroy();
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    failing,
    requests: (id) => counts.get(id) ?? 0,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
