/**
 * The simulator's text answers (`output: 'text'`): prose, lists and a little code, composed
 * word by word from a built-in word list with the request's own PRNG, so that an answer is a
 * pure function of the request's seed and rid. The simulator encodes the composed text once
 * with its tokenizer and cuts the ids to the drawn length: canonical ids, as a real model mostly
 * emits, unlike random ids, whose decoded text encodes to other ids.
 */
import type { Rng } from './random.js';

const WORDS = `the of and to in is that for it as with was on be by this are from at or an have not which
but all were when we there can more if will one about their has would other so what up out them some time
these two may then do first any like now my such make over our even most also after made many before must
through back years where much your way well down should because each just those people how too little state
good very world still own see work long get here between both life being under never day same another know
while last might great old year off come since against go came right used take three small large place
around however home again number part found public system water city early later house group high point
line level order case field study model data result value process method test set form power light change
river market plan table chart paper report story book road music garden morning evening simple clear quiet
bright warm cold green blue red white black open close start finish build write read learn teach answer
question problem idea reason example step rule note list sample token batch server queue budget record
memory engine signal stream source target output input window layer weight carefully quickly slowly
together always often sometimes usually rather almost enough already mountain valley forest ocean island
desert cloud stone bridge tower village harbor station machine letter circle square corner center border
season summer winter spring autumn function variable array string integer loop branch request response
cache thread buffer compile install deploy measure compare explain consider notice suppose remember`.split(/\s+/);

const NAMES = ['count', 'total', 'items', 'value', 'result', 'index', 'name', 'size', 'data', 'limit'];
const FUNCTIONS = ['compute', 'parse', 'load', 'merge', 'check', 'render', 'split', 'update', 'collect'];

/** One composed piece of text and how many tokens it is at least (one per word, mark or symbol run). */
interface Piece {
  text: string;
  units: number;
}

function pick<T>(rng: Rng, list: readonly T[]): T {
  return list[Math.floor(rng() * list.length)] as T;
}

function capitalized(word: string): string {
  return word.charAt(0).toUpperCase() + word.slice(1);
}

/** A sentence of 5–18 words, commas now and then, ended by `.`, `?` or `!`. */
function sentence(rng: Rng): Piece {
  const n = 5 + Math.floor(rng() * 14);
  const words: string[] = [];
  let units = 0;
  for (let i = 0; i < n; i++) {
    let w = pick(rng, WORDS);
    if (i === 0) w = capitalized(w);
    if (i > 0 && i < n - 1 && rng() < 0.08) {
      w += ',';
      units += 1;
    }
    words.push(w);
    units += 1;
  }
  const r = rng();
  return { text: `${words.join(' ')}${r < 0.85 ? '.' : r < 0.95 ? '?' : '!'}`, units: units + 1 };
}

function paragraph(rng: Rng): Piece {
  const n = 1 + Math.floor(rng() * 5);
  const parts: string[] = [];
  let units = 0;
  for (let i = 0; i < n; i++) {
    const s = sentence(rng);
    parts.push(s.text);
    units += s.units;
  }
  return { text: parts.join(' '), units };
}

/** A bulleted or numbered list of 2–5 short items. */
function list(rng: Rng): Piece {
  const n = 2 + Math.floor(rng() * 4);
  const numbered = rng() < 0.5;
  const lines: string[] = [];
  let units = 0;
  for (let i = 0; i < n; i++) {
    const k = 2 + Math.floor(rng() * 6);
    const words = Array.from({ length: k }, () => pick(rng, WORDS));
    words[0] = capitalized(words[0] as string);
    lines.push(`${numbered ? `${i + 1}.` : '-'} ${words.join(' ')}`);
    units += k + 2;
  }
  return { text: lines.join('\n'), units };
}

/** A short fenced Python function. */
function code(rng: Rng): Piece {
  const fn = pick(rng, FUNCTIONS);
  const a = pick(rng, NAMES);
  const b = pick(
    rng,
    NAMES.filter((x) => x !== a),
  );
  const k = 1 + Math.floor(rng() * 9);
  const body = [
    '```python',
    `def ${fn}_${a}(${a}, ${b}=${k}):`,
    `    """${capitalized(pick(rng, WORDS))} the ${pick(rng, WORDS)} ${pick(rng, WORDS)}."""`,
    `    for i in range(${b}):`,
    `        ${a} = ${a} + i * ${k}`,
    `    return ${a}`,
    '```',
  ];
  return { text: body.join('\n'), units: 40 };
}

/**
 * Text of at least `minTokens` tokens for any tokenizer that splits on spaces (each word, mark
 * and symbol run counted is at least one token): paragraphs, and now and then a list or a code
 * block, separated by blank lines. Starts with a word, never with whitespace.
 */
export function composeAnswer(rng: Rng, minTokens: number): string {
  const blocks: string[] = [];
  let units = 0;
  while (units < minTokens) {
    const r = rng();
    const piece = blocks.length > 0 && r < 0.08 ? code(rng) : blocks.length > 0 && r < 0.2 ? list(rng) : paragraph(rng);
    blocks.push(piece.text);
    units += piece.units + 1;
  }
  return blocks.join('\n\n');
}
