import type { Command } from 'commander';
import {
  errorMessage,
  isRecord,
  loadConfig,
  loadConfiguredTokenizer,
  logger,
  runDir,
  type ChatMessage,
  type ChatTokenizer,
} from '../../shared/index.js';
import { readConversationViews, showableDataset, type ConversationView, type TurnView } from '../conversation-view.js';
import { openRunContextFor, type RunContext } from '../run-context.js';

const INDENT = '    ';

/** A block of text, every line indented; an empty text says so. */
function block(text: string): string {
  if (text === '') return `${INDENT}(empty)`;
  return text
    .split('\n')
    .map((l) => (l === '' ? '' : INDENT + l))
    .join('\n');
}

/** A message's content, its reasoning before it and its calls after it, each call on a line. */
function body(m: ChatMessage): string[] {
  const lines: string[] = [];
  if (m.reasoning_content !== undefined && m.reasoning_content !== '')
    lines.push(`${INDENT}(reasoning)`, block(m.reasoning_content), `${INDENT}(answer)`);
  if (m.content !== '' || m.tool_calls === undefined || m.tool_calls.length === 0) lines.push(block(m.content));
  for (const c of m.tool_calls ?? []) lines.push(`${INDENT}call: ${JSON.stringify(c)}`);
  return lines;
}

/** `[user]`, `[tool get_weather call_1]`, then its content. */
function message(m: ChatMessage): string {
  const label = [m.role, m.name, m.tool_call_id].filter((x) => x !== undefined && x !== '').join(' ');
  return [`  [${label}]`, ...body(m)].join('\n');
}

/** `get_weather {"city": "Paris"} · id call_1_0`; a call of another shape as its JSON. */
function callLine(c: unknown): string {
  const fn = isRecord(c) && isRecord(c.function) ? c.function : undefined;
  if (fn === undefined || typeof fn.name !== 'string') return JSON.stringify(c);
  const args = typeof fn.arguments === 'string' ? fn.arguments : JSON.stringify(fn.arguments);
  const id = isRecord(c) && typeof c.id === 'string' ? ` · id ${c.id}` : '';
  return `${fn.name} ${args}${id}`;
}

function turnHeader(t: TurnView, v: ConversationView): string {
  const of = v.turnCount === null ? '' : ` of ${v.turnCount}`;
  const head = v.kind === 'conversation' ? `turn ${t.turn}${of} · ${t.id}` : `answer · ${t.id}`;
  if (!t.generated) return `── ${head} · not generated: ${t.notGenerated ?? '?'}`;
  const parts = [head];
  if (v.kind === 'conversation') parts.push(`prompt ${t.prompt ?? '?'}`);
  parts.push(
    `finish: ${t.finish?.text ?? '?'}`,
    `${t.promptTokens ?? 0} prompt + ${t.outputTokens ?? 0} output tokens`,
  );
  return `── ${parts.join(' · ')}`;
}

function formatTurn(t: TurnView, v: ConversationView): string {
  const out = [turnHeader(t, v)];
  if (t.source.length > 0) {
    out.push(v.kind === 'conversation' ? '  source (before this turn):' : '  prompt:');
    for (const m of t.source) out.push(message(m));
  }
  if (t.sourceAnswer !== null) {
    out.push('  source answer (never sent):', ...body(t.sourceAnswer));
  }
  if (t.generated) {
    out.push('  regenerated answer:');
    out.push(block(t.text ?? ''));
  }
  if (t.toolCalls !== undefined) {
    out.push(`  tool calls (${t.toolCalls.length}${v.toolCallFormat ? `, read as ${v.toolCallFormat}` : ''}):`);
    for (const c of t.toolCalls) out.push(`${INDENT}${callLine(c)}`);
  }
  if (t.toolCallError !== undefined) out.push(`  tool calls: do not parse (${t.toolCallError})`);
  if (t.toolResults !== undefined) {
    const how = t.toolResults.origin === 'executor' ? 'executed' : 'spliced from the source';
    out.push(`  tool results placed after it (${how}):`);
    for (const m of t.toolResults.messages) out.push(message(m));
  }
  return out.join('\n');
}

/** The view as a person reads it: a header, how it ended, then each turn. */
export function formatConversationView(v: ConversationView): string {
  const what =
    v.kind === 'conversation'
      ? `conversation of ${v.turnCount === null ? '?' : v.turnCount} turn(s)`
      : 'prompt (one answer)';
  const lines = [`${v.dataset} / ${v.id} · ${what}`];
  lines.push(
    v.promptFound
      ? `source: ${v.promptFile} (id ${v.promptId})`
      : `source: not shown: ${v.sourceError ?? `no line with id "${v.promptId}" in ${v.promptFile}`}`,
  );
  if (v.tools.length > 0)
    lines.push(
      `tools: ${v.tools.join(', ')}` +
        (v.toolCallFormat === null ? ' (the chat template renders no call: calls not read)' : ''),
    );
  lines.push(`${v.kind === 'conversation' ? 'end' : 'state'}: ${v.end.text}`);
  for (const t of v.turns) lines.push('', formatTurn(t, v));
  return lines.join('\n');
}

/** Opens the run's Redis, or says why not (the view then shows what the files hold). */
async function tryRunContext(config: ReturnType<typeof loadConfig>): Promise<RunContext | string> {
  try {
    return await openRunContextFor(config);
  } catch (e: unknown) {
    return errorMessage(e);
  }
}

/** `show`. */
export function registerShowCommand(program: Command): void {
  program
    .command('show')
    .description(
      "print one conversation of a dataset turn by turn: each turn's source messages and the regenerated answer, its tool calls and the results placed after them, whether its prompt was spliced or rendered, its finish reason, and how the conversation ended (a single-turn prompt: its prompt and answer)",
    )
    .requiredOption('-c, --config <file>', 'config file (YAML)')
    .option('--json', 'print one JSON object per conversation shown (one line each)')
    .argument('<dataset>', 'dataset name')
    .argument(
      '<id>',
      "the prompt's id; a sample's (`<id>#s<j>`, with samplesPerPrompt > 1; a prompt id shows every sample) or a turn's (`<id>#t<k>`: its conversation)",
    )
    .action(async (dataset: string, id: string, opts: { config: string; json?: boolean }) => {
      const config = loadConfig({ path: opts.config });
      showableDataset(config, dataset);
      const ctx = await tryRunContext(config);
      if (typeof ctx === 'string')
        logger('show').warn({ reason: ctx }, 'Redis not reachable: showing what the files hold');
      try {
        let tokenizer: Promise<ChatTokenizer> | undefined;
        const views = await readConversationViews({
          config,
          dataset,
          id,
          tokenizer: () => (tokenizer ??= loadConfiguredTokenizer(config)),
          redis: typeof ctx === 'string' ? undefined : { conn: ctx.redis, keys: ctx.keys },
          runDir: runDir(config),
        });
        process.stdout.write(
          opts.json === true
            ? views.map((v) => `${JSON.stringify(v)}\n`).join('')
            : `${views.map(formatConversationView).join('\n\n')}\n`,
        );
      } finally {
        if (typeof ctx !== 'string') await ctx.close();
      }
    });
}
