// The pipeline page: renders the run's status from the dashboard's event stream (falling back to
// polling /api/status), and sends per-dataset actions by POST. No token lives here: the browser
// sends the basic-auth credentials it asked for when the page was opened.
'use strict';

const $ = (sel) => document.querySelector(sel);
const fmt = (n) => Math.round(n).toLocaleString('en-US');
const samples = [];
let lastStatus = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function duration(s) {
  if (s === null || s === undefined) return '?';
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.round(s / 60)}m`;
  return `${(s / 3600).toFixed(1)}h`;
}

function ms(n) {
  return n < 1000 ? `${Math.round(n)} ms` : n < 60_000 ? `${(n / 1000).toFixed(1)} s` : duration(n / 1000);
}

function eta(d) {
  if (d.status === 'completed') return '-';
  if (d.etaSeconds.low === null) return '?';
  const lo = duration(d.etaSeconds.low);
  const hi = duration(d.etaSeconds.high ?? d.etaSeconds.low);
  return lo === hi ? lo : `${lo}–${hi}`;
}

function setConnection(state, text) {
  const c = $('#connection');
  c.dataset.state = state;
  c.textContent = text;
}

function renderPhases(phases) {
  $('#phases').replaceChildren(
    ...phases.map((p) =>
      el(
        'li',
        { 'data-phase': p.name, 'data-status': p.status, 'data-configured': String(p.configured) },
        el('b', {}, p.name),
        el(
          'small',
          {},
          p.configured ? `${p.status.replace('_', ' ')}${p.detail ? ` · ${p.detail}` : ''}` : 'not configured',
        ),
      ),
    ),
  );
}

// The train steps that write hidden states: each one's estimate, its inputs and the disk.
function renderTrainSteps(train) {
  const steps = (train && train.hiddenStates) || [];
  $('#train-steps').replaceChildren(
    ...steps.map((h) =>
      el(
        'li',
        { 'data-step': h.step, 'data-verdict': h.verdict, 'data-bytes': String(h.bytes) },
        `train step ${h.step} (${h.stepIndex + 1}/${h.steps}): ${h.text}`,
      ),
    ),
  );
}

const fixed = (x, digits) => (x === null || x === undefined ? '-' : x.toFixed(digits));
const signed = (x, digits) => {
  if (x === null || x === undefined) return '';
  const v = Number(x.toFixed(digits));
  return `${v < 0 ? '-' : '+'}${Math.abs(v).toFixed(digits)}`;
};
const svgEl = (tag, attrs, text) => {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
};

// Acceptance length (overall) of each evaluated attempt, oldest first: plain SVG, 1 at the bottom.
function renderEvalChart(attempts) {
  const svg = $('#eval-chart');
  const pts = attempts.filter((a) => a.acceptLength !== null);
  if (pts.length === 0) {
    svg.replaceChildren();
    return;
  }
  const [w, h, left, right, top, bottom] = [480, 160, 34, 14, 16, 22];
  const max = Math.max(2, ...pts.map((a) => a.acceptLength));
  const top1 = Math.ceil(max + 0.25);
  const x = (i) => (pts.length === 1 ? (left + w - right) / 2 : left + (i * (w - left - right)) / (pts.length - 1));
  const y = (v) => h - bottom - ((v - 1) / (top1 - 1)) * (h - top - bottom);
  const children = [];
  for (let v = 1; v <= top1; v++) {
    children.push(svgEl('line', { x1: left, x2: w - right, y1: y(v), y2: y(v) }));
    children.push(svgEl('text', { x: 4, y: y(v) + 3 }, String(v)));
  }
  children.push(svgEl('polyline', { points: pts.map((a, i) => `${x(i)},${y(a.acceptLength)}`).join(' ') }));
  pts.forEach((a, i) => {
    const c = svgEl('circle', {
      cx: x(i),
      cy: y(a.acceptLength),
      r: 4,
      'data-attempt': a.attempt,
      'data-accept-length': a.acceptLength,
      'data-ok': String(a.ok),
      'data-source': a.source || 'unknown',
    });
    c.append(
      svgEl(
        'title',
        {},
        `attempt ${a.attempt}: accept len ${fixed(a.acceptLength, 2)}, speed-up ${fixed(a.speedup, 2)}x${
          a.source === 'simulator' ? " (simulated: the simulator's configured acceptance)" : ''
        }`,
      ),
    );
    children.push(c);
    children.push(svgEl('text', { x: x(i) - 8, y: y(a.acceptLength) - 8 }, fixed(a.acceptLength, 2)));
    children.push(svgEl('text', { x: x(i) - 12, y: h - 6 }, a.attempt));
  });
  svg.replaceChildren(...children);
}

// The eval step's verdicts: the latest job, the chart, the latest report's warnings and figures.
function renderEval(e) {
  const attempts = (e && e.attempts) || [];
  const r = e && e.report;
  const job = e && e.job;
  const jobText = job
    ? `eval ${job.state}${job.attempt ? ` (attempt ${job.attempt})` : ''}${
        job.state === 'waiting'
          ? ` — ${job.waiting || ''}`
          : job.reason
            ? ` — ${job.reason}`
            : job.detail
              ? ` — ${job.detail}`
              : ''
      }`
    : '';
  const simulated = r && r.source === 'simulator';
  const reportText = r
    ? `attempt ${r.attempt}${simulated ? ' (simulated)' : ''}: ${r.ok ? 'passed' : 'FAILED'} · accept len ${fixed(r.overall.drafter.acceptLength, 2)} · speed-up ${
        r.overall.speedup === null ? '-' : `${r.overall.speedup.toFixed(2)}x`
      }${r.previous ? ` · compared with attempt ${r.previous.attempt}` : ''}`
    : '';
  $('#eval-summary').textContent =
    [reportText, jobText].filter((t) => t !== '').join(' · ') ||
    'no evaluation yet (with an eval section, the eval step runs after each training)';
  // Figures the simulator produced say so: its acceptance is configured, not the drafter's.
  const source = $('#eval-source');
  source.dataset.source = r ? r.source || 'unknown' : 'none';
  source.hidden = !simulated;
  source.textContent = simulated
    ? (r.simulated && r.simulated.note) ||
      "SIMULATED: the figures come from tokenmill's SGLang simulator, not from a measurement of the drafter"
    : '';
  const configured = simulated && r.simulated && r.simulated.acceptanceConfigured ? r.simulated.datasets : null;
  $('#eval-datasets th[data-field="configured"]').hidden = configured === null;
  const warnings = r ? r.warnings.map((w) => ['warning', `WARNING: ${w}`]) : [];
  const failed = r ? r.failed.map((f) => ['failed', `FAILED: ${f.message}`]) : [];
  $('#eval-warnings').replaceChildren(
    ...[...failed, ...warnings].map(([kind, text]) => el('li', { 'data-kind': kind }, text)),
  );
  renderEvalChart(attempts);
  $('#eval-legend').textContent =
    attempts.length === 0
      ? ''
      : `acceptance length (tokens per verify step) of each attempt's drafter, overall; ${attempts.length} attempt${attempts.length === 1 ? '' : 's'} evaluated`;
  const rows = r
    ? [...r.datasets.map((d) => [d.dataset, d]), ...(r.datasets.length === 1 ? [] : [['overall', r.overall]])]
    : [];
  $('#eval-datasets tbody').replaceChildren(
    ...rows.map(([name, s]) =>
      el(
        'tr',
        { 'data-dataset': name },
        el('td', {}, name),
        el('td', { 'data-field': 'acceptLength' }, fixed(s.drafter.acceptLength, 2)),
        // The acceptance the simulator was set to, beside the one its answers gave; only when simulated.
        ...(configured === null
          ? []
          : [
              el(
                'td',
                { 'data-field': 'configured' },
                configured[name] === undefined ? '-' : fixed(configured[name], 2),
              ),
            ]),
        el('td', {}, signed(s.delta && s.delta.acceptLength, 2)),
        el('td', { 'data-field': 'speedup' }, s.speedup === null ? '-' : `${s.speedup.toFixed(2)}x`),
        el('td', {}, signed(s.delta && s.delta.speedup, 2)),
      ),
    ),
  );
}

function bar(d) {
  if (d.tokenBudget === null) return el('span', {}, fmt(d.outputTokens));
  const pct = d.tokenBudget === 0 ? 100 : Math.min(100, (100 * d.outputTokens) / d.tokenBudget);
  const b = el(
    'div',
    { class: 'bar', title: `${pct.toFixed(1)}%` },
    el('i', {}),
    el('span', {}, `${fmt(d.outputTokens)} / ${fmt(d.tokenBudget)}`),
  );
  b.firstChild.style.width = `${pct}%`;
  return b;
}

function actionButton(dataset, action, label) {
  const b = el('button', { type: 'button', 'data-action': action, 'data-dataset': dataset }, label);
  b.addEventListener('click', () => void act(dataset, action, b));
  return b;
}

// turns: all — the records are turns; the conversations by how far they got.
function conversationsNote(d) {
  const c = d.conversations;
  if (!c) return [];
  const causes = Object.entries(c.endedBy || {}).sort((a, b) => b[1] - a[1]);
  return [
    el(
      'div',
      { class: 'note', 'data-field': 'conversations' },
      `records are turns · conversations: ${fmt(c.complete)} complete, ${fmt(c.partial)} partial, ${fmt(c.ended)} ended early`,
      // Ended early by cause, each with a conversation to look at (`tokenmill show <dataset> <id>`).
      ...causes.flatMap(([cause, n]) => {
        const example = (c.endedExample || {})[cause];
        return [
          ' · ',
          el(
            'span',
            { class: 'cause', 'data-field': 'ended-by', 'data-cause': cause },
            `${fmt(n)} ${cause}`,
            ...(example ? [' · e.g. ', el('code', { 'data-field': 'ended-example', title: example }, example)] : []),
          ),
        ];
      }),
    ),
    // Why conversations ended early: the latest few, each with its reason.
    ...(c.lastEnded || [])
      .slice(0, 3)
      .map((e) =>
        el(
          'div',
          { class: 'note', 'data-field': 'conversation-ended', title: e.reason },
          `ended: ${e.id}${e.turn === null ? '' : ` at turn ${e.turn}`}: ${e.reason}`,
        ),
      ),
  ];
}

// A dataset's notes (why it failed, its conversations) go in a row of their own under its figures,
// as wide as the table: in a cell of one column they made the row as tall as the page.
function notesRow(d, columns) {
  const notes = [
    ...(d.failedReason ? [el('div', { class: 'note', 'data-field': 'failed-reason' }, d.failedReason)] : []),
    ...conversationsNote(d),
  ];
  if (notes.length === 0) return [];
  return [el('tr', { class: 'notes', 'data-notes-of': d.name }, el('td', { colSpan: columns }, ...notes))];
}

function renderDatasets(datasets) {
  const columns = $('#datasets thead tr').children.length;
  const rows = datasets.flatMap((d) => {
    const generation = d.tokenBudget !== null || Object.keys(d.jobs || {}).length > 0;
    const cells = [
      el('td', { 'data-field': 'name' }, d.name),
      el(
        'td',
        { class: `text status-${d.status}`, 'data-field': 'status' },
        d.status.replace('_', ' ') + (d.stalled ? ' (STALLED)' : ''),
      ),
      el('td', { 'data-field': 'tokens' }, bar(d)),
      el('td', { 'data-field': 'records' }, fmt(d.records)),
      el('td', { 'data-field': 'tokensPerSec' }, fmt(d.tokensPerSec)),
      el('td', { 'data-field': 'eta' }, eta(d)),
      el('td', { 'data-field': 'inFlight' }, fmt(d.inFlight)),
      el('td', { 'data-field': 'failed' }, fmt(d.failed)),
      el('td', { 'data-field': 'skipped' }, fmt(d.skipped)),
      el('td', { 'data-field': 'paused' }, d.paused ? 'yes' : 'no'),
      el(
        'td',
        { class: 'actions', 'data-field': 'actions' },
        ...(generation
          ? [
              ...(d.paused
                ? [actionButton(d.name, 'resume', 'Resume')]
                : d.status === 'completed'
                  ? []
                  : [actionButton(d.name, 'pause', 'Pause')]),
              ...(d.failed > 0 ? [actionButton(d.name, 'retry-failed', `Retry ${fmt(d.failed)} failed`)] : []),
            ]
          : []),
      ),
    ];
    const notes = notesRow(d, columns);
    return [
      el(
        'tr',
        { 'data-dataset': d.name, 'data-status': d.status, ...(notes.length > 0 ? { class: 'with-notes' } : {}) },
        ...cells,
      ),
      ...notes,
    ];
  });
  $('#datasets tbody').replaceChildren(...rows);
}

function renderEndpoints(status) {
  const h = status.endpoints;
  $('#endpoint-summary').textContent =
    h.reported === 0 ? `${h.total} configured; no inference worker reporting` : `${h.healthy}/${h.total} healthy`;
  const requests = new Map((status.endpointRequests || []).map((r) => [r.url, r]));
  $('#endpoints tbody').replaceChildren(
    ...h.endpoints.map((e) => {
      const r = requests.get(e.url) || { inFlight: 0, errors: {}, recentLatencyMs: null };
      const health = e.up === null ? 'unknown' : e.up ? 'healthy' : `down: ${e.reason || '?'}`;
      const errors =
        Object.entries(r.errors)
          .map(([k, v]) => `${k}×${v}`)
          .join(' ') || '0';
      const latency = r.recentLatencyMs ? `${ms(r.recentLatencyMs.p50)} / ${ms(r.recentLatencyMs.p95)}` : '-';
      return el(
        'tr',
        { 'data-endpoint': e.url },
        el('td', {}, e.url),
        el('td', { class: `text ${e.up === true ? 'up' : e.up === false ? 'down' : ''}` }, health),
        el('td', {}, fmt(r.inFlight)),
        el('td', {}, latency),
        el('td', {}, errors),
      );
    }),
  );
}

function renderWorkers(workers, nowMs) {
  const rows = workers.map((w) =>
    el(
      'tr',
      { 'data-role': w.role },
      el('td', {}, w.role),
      el('td', { class: 'text' }, w.host),
      el('td', {}, w.pid),
      el('td', {}, duration((nowMs - w.startedMs) / 1000)),
      el('td', {}, w.role === 'inference' ? fmt(w.inFlight) : '-'),
    ),
  );
  if (rows.length === 0) rows.push(el('tr', {}, el('td', { colSpan: 5 }, 'no live worker')));
  $('#workers tbody').replaceChildren(...rows);
}

function renderChart() {
  const svg = $('#chart-svg');
  const points = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1];
    const b = samples[i];
    const dt = (b.t - a.t) / 1000;
    if (dt <= 0) continue;
    let d = 0;
    for (const [name, tokens] of Object.entries(b.tokens)) d += Math.max(0, tokens - (a.tokens[name] ?? tokens));
    points.push([b.t, d / dt]);
  }
  if (points.length < 2) {
    svg.replaceChildren();
    $('#chart-legend').textContent = 'collecting samples (one every 10 s)…';
    return;
  }
  // The last hour, or less while the dashboard has been up for less.
  const end = points[points.length - 1][0];
  const start = Math.max(end - 3600_000, samples[0].t);
  const span = Math.max(1, end - start);
  const shown = points.filter((p) => p[0] >= start);
  const max = Math.max(1, ...shown.map((p) => p[1]));
  const line = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
  line.setAttribute(
    'points',
    shown.map(([t, v]) => `${((t - start) / span) * 800},${160 - (v / max) * 150}`).join(' '),
  );
  svg.replaceChildren(line);
  $('#chart-legend').textContent =
    `committed output tokens/s over the last ${duration(span / 1000)}: now ${fmt(shown[shown.length - 1][1])} · peak ${fmt(max)} · 0 at the bottom`;
}

function render(update) {
  const status = update.status;
  lastStatus = status;
  $('#run').textContent = status.run;
  document.title = `tokenmill · ${status.run}`;
  renderPhases(status.phases);
  renderTrainSteps(status.train);
  renderEval(status.eval);
  renderDatasets(status.datasets);
  renderEndpoints(status);
  renderWorkers(status.workers || [], update.readAtMs);
  if (update.sample) {
    samples.push(update.sample);
    while (samples.length > 0 && samples[0].t < update.sample.t - 3600_000) samples.shift();
    renderChart();
  }
  const when = new Date(update.readAtMs);
  $('#updated').textContent = when.toLocaleTimeString();
  $('#updated').dataset.readAt = String(update.readAtMs);
}

async function act(dataset, action, button) {
  button.disabled = true;
  try {
    const res = await fetch(`api/datasets/${encodeURIComponent(dataset)}/${action}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{}',
    });
    const body = await res.json().catch(() => ({}));
    $('#action-result').textContent = res.ok
      ? `${dataset}: ${action}${body.retried !== undefined ? ` (${body.retried} prompt(s) sent again)` : ''} done`
      : `${dataset}: ${action} failed: ${body.error || res.status}`;
    await poll();
  } finally {
    button.disabled = false;
  }
}

async function poll() {
  const res = await fetch('api/status', { cache: 'no-store' });
  if (!res.ok) throw new Error(`GET api/status answered ${res.status}`);
  render({ kind: 'status', status: await res.json(), sample: null, readAtMs: Date.now() });
}

function connect() {
  const events = new EventSource('api/events');
  events.addEventListener('history', (e) => {
    samples.splice(0, samples.length, ...JSON.parse(e.data).samples);
    renderChart();
  });
  events.addEventListener('status', (e) => {
    setConnection('live', 'live');
    render(JSON.parse(e.data));
  });
  events.addEventListener('error', (e) => {
    // A server-sent "error" event carries data: the dashboard cannot read Redis.
    if (e.data) {
      const u = JSON.parse(e.data);
      setConnection(
        'error',
        `${u.message} (since ${new Date(u.sinceMs).toLocaleTimeString()}; showing the last status)`,
      );
      return;
    }
    // The stream itself broke: EventSource reconnects on its own; say so meanwhile.
    setConnection(
      'lost',
      `connection to the dashboard lost; reconnecting…${lastStatus ? ' (showing the last status)' : ''}`,
    );
  });
}

connect();
