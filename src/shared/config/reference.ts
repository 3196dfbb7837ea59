/** The config's JSON Schema and the reference table in docs/config.md, generated from the schema. */
import { z } from 'zod';
import { ConfigSchema } from './config.js';

/** A JSON Schema (draft 2020-12) node, as far as the reference generator reads it. */
export interface JsonSchemaNode {
  type?: string | string[];
  description?: string;
  default?: unknown;
  properties?: Record<string, JsonSchemaNode>;
  required?: string[];
  items?: JsonSchemaNode;
  additionalProperties?: boolean | JsonSchemaNode;
  enum?: unknown[];
  format?: string;
  pattern?: string;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  exclusiveMaximum?: number;
  minItems?: number;
  minLength?: number;
  [key: string]: unknown;
}

/**
 * The JSON Schema of the config file (what users write, before defaults), e.g. for editor
 * completion via `# yaml-language-server: $schema=…`.
 */
export function configJsonSchema(): JsonSchemaNode {
  const schema = z.toJSONSchema(ConfigSchema, { io: 'input', unrepresentable: 'any' }) as JsonSchemaNode;
  // zod marks every integer with the safe-integer bounds; they say nothing to a reader.
  const tidy = (node: unknown): void => {
    if (typeof node !== 'object' || node === null) return;
    const n = node as Record<string, unknown>;
    if (n.maximum === Number.MAX_SAFE_INTEGER) delete n.maximum;
    if (n.minimum === Number.MIN_SAFE_INTEGER) delete n.minimum;
    for (const v of Object.values(n)) tidy(v);
  };
  tidy(schema);
  return { ...schema, title: 'tokenmill config' };
}

/** One row of the config reference. */
export interface ConfigReferenceRow {
  /** e.g. `datasets[].sampling.top_p` */
  path: string;
  type: string;
  /** The default as JSON, `required`, or `—` for optional keys without one. */
  default: string;
  description: string;
}

/** Every config key (sections included), depth first, from the JSON Schema. */
export function configReferenceRows(): ConfigReferenceRow[] {
  const rows: ConfigReferenceRow[] = [];
  const walk = (node: JsonSchemaNode, prefix: string): void => {
    const required = new Set(node.required ?? []);
    for (const [key, prop] of Object.entries(node.properties ?? {})) {
      const path = prefix === '' ? key : `${prefix}.${key}`;
      rows.push({
        path,
        type: describeType(prop),
        default: prop.default !== undefined ? JSON.stringify(prop.default) : required.has(key) ? 'required' : '—',
        description: prop.description ?? '',
      });
      if (prop.properties !== undefined) walk(prop, path);
      if (prop.items?.properties !== undefined) walk(prop.items, `${path}[]`);
    }
  };
  walk(configJsonSchema(), '');
  return rows;
}

function describeType(node: JsonSchemaNode): string {
  if (node.enum !== undefined) return node.enum.map((v) => JSON.stringify(v)).join(' \\| ');
  if (node.const !== undefined) return JSON.stringify(node.const);
  if (Array.isArray(node.anyOf)) return (node.anyOf as JsonSchemaNode[]).map(describeType).join(' \\| ');
  const type = Array.isArray(node.type) ? node.type.join(' \\| ') : (node.type ?? 'any');
  if (type === 'array') {
    const item =
      node.items === undefined ? 'any' : node.items.properties !== undefined ? 'object' : describeType(node.items);
    const min = node.minItems !== undefined && node.minItems > 0 ? `, at least ${node.minItems}` : '';
    return `list of ${item}${min}`;
  }
  if (type === 'integer' || type === 'number') {
    const lo = node.exclusiveMinimum ?? node.minimum;
    const hi = node.exclusiveMaximum ?? node.maximum;
    if (lo !== undefined && hi !== undefined) {
      return `${type} in ${node.exclusiveMinimum !== undefined ? '(' : '['}${lo}, ${hi}${node.exclusiveMaximum !== undefined ? ')' : ']'}`;
    }
    if (lo !== undefined) return `${type} ${node.exclusiveMinimum !== undefined ? '>' : '>='} ${lo}`;
    if (hi !== undefined) return `${type} ${node.exclusiveMaximum !== undefined ? '<' : '<='} ${hi}`;
    return type;
  }
  if (type === 'string') {
    if (node.format === 'uri') return 'URL';
    if (node.pattern !== undefined) return `string matching \`${node.pattern}\``;
    return 'string';
  }
  return type;
}

/** The config reference as a Markdown table (path, type, default, description), for docs/config.md. */
export function configReferenceMarkdown(): string {
  const cell = (s: string): string => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');
  const lines = ['| key | type | default | description |', '| --- | --- | --- | --- |'];
  for (const r of configReferenceRows()) {
    const def = r.default === 'required' ? '*required*' : r.default === '—' ? '—' : `\`${cell(r.default)}\``;
    // Types already escape their own `|`.
    lines.push(`| \`${r.path}\` | ${r.type} | ${def} | ${cell(r.description)} |`);
  }
  return `${lines.join('\n')}\n`;
}
