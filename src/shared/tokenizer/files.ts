/** The files of a Hugging Face tokenizer folder, read with errors that name the file. */
import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';

import { EnvironmentError, errorMessage } from '../errors.js';
import { isRecord } from '../util/index.js';

export async function readJsonFile(file: string, what: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e: unknown) {
    const code = (e as NodeJS.ErrnoException).code;
    const reason = code === 'ENOENT' ? 'is missing' : `cannot be read (${errorMessage(e)})`;
    throw new EnvironmentError(`${what}: ${file} ${reason}`, { cause: e });
  }
  return parseJsonObject(text, file, what);
}

/** `text` (read from `file`) as a JSON object, else an {@link EnvironmentError} naming the file. */
function parseJsonObject(text: string, file: string, what: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (e: unknown) {
    throw new EnvironmentError(`${what}: ${file} is not valid JSON (${errorMessage(e)})`, { cause: e });
  }
  if (!isRecord(parsed)) throw new EnvironmentError(`${what}: ${file} is not a JSON object`);
  return parsed;
}

export async function readOptionalText(file: string): Promise<string | undefined> {
  try {
    return await readFile(file, 'utf8');
  } catch (e: unknown) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new EnvironmentError(`tokenizer: ${file} cannot be read (${errorMessage(e)})`, { cause: e });
  }
}

/**
 * Chat templates stored as files, which transformers prefers over the config's `chat_template`:
 * `chat_template.jinja` ("default") and `additional_chat_templates/<name>.jinja`.
 */
export async function readTemplateFiles(dir: string): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const main = await readOptionalText(path.join(dir, 'chat_template.jinja'));
  if (main !== undefined) out.set('default', main);
  const extraDir = path.join(dir, 'additional_chat_templates');
  let names: string[] = [];
  try {
    names = await readdir(extraDir);
  } catch {
    // No extra templates: the common case.
  }
  for (const file of names.filter((n) => n.endsWith('.jinja')).sort()) {
    const text = await readOptionalText(path.join(extraDir, file));
    if (text !== undefined) out.set(file.slice(0, -'.jinja'.length), text);
  }
  return out;
}

/**
 * A JSON object file that may be absent (`generation_config.json`): undefined when it is
 * missing, an {@link EnvironmentError} naming it when it is there but unreadable or not an object.
 */
export async function readOptionalJsonFile(file: string, what: string): Promise<Record<string, unknown> | undefined> {
  const text = await readOptionalText(file);
  return text === undefined ? undefined : parseJsonObject(text, file, what);
}
