// The pieces of the simulator's tool calls: the format read from a chat template, the calls
// written in each family's format, the plan as a pure function of the request and the tools, and
// the option checks.
import { describe, expect, it } from 'vitest';

import { parseToolCalls, TOOL_CALL_FORMATS } from '../../src/shared/index.js';
import { agentPlan, readToolPrompt, writeToolCalls, type SimCall } from '../../src/sim/index.js';
import { resolveToolCalls } from '../../src/sim/tool-calls.js';

const call = (name: string, args: Record<string, unknown>, malformed = false): SimCall => ({
  name,
  arguments: args,
  divergent: false,
  malformed,
});

describe('simulated tool calls', () => {
  it("writes each family's format, parallel calls included, and breaks a malformed call's JSON", () => {
    const calls = [call('read_file', { path: 'a.py' }), call('run_shell', { command: 'ls' })];
    expect(writeToolCalls('hermes', calls, { preamble: 'Looking.' })).toBe(
      'Looking.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>\n' +
        '<tool_call>\n{"name": "run_shell", "arguments": {"command": "ls"}}\n</tool_call>',
    );
    expect(writeToolCalls('llama3', calls)).toBe(
      '{"name": "read_file", "parameters": {"path": "a.py"}}; {"name": "run_shell", "parameters": {"command": "ls"}}',
    );
    expect(writeToolCalls('deepseekv3', calls.slice(0, 1))).toBe(
      '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n```json\n{"path": "a.py"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    );
    expect(writeToolCalls('kimi_k2', calls, { firstIndex: 3 })).toBe(
      '<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:3<|tool_call_argument_begin|>{"path": "a.py"}<|tool_call_end|>' +
        '<|tool_call_begin|>functions.run_shell:4<|tool_call_argument_begin|>{"command": "ls"}<|tool_call_end|><|tool_calls_section_end|>',
    );
    const broken = writeToolCalls('hermes', [call('read_file', { path: 'a.py' }, true)]);
    const json = /<tool_call>\n(.*)\n<\/tool_call>/.exec(broken)?.[1] ?? '';
    expect(json.startsWith('{"name": "read_file", "arguments": ')).toBe(true);
    expect(() => JSON.parse(json) as unknown).toThrow();
  });

  it("writes what tokenmill's parser reads back, in every format; a malformed call does not parse", () => {
    const calls = [call('read_file', { path: 'a.py', start_line: 3 }), call('run_shell', { command: 'ls -la' })];
    for (const format of TOOL_CALL_FORMATS) {
      const text = writeToolCalls(format, calls, { preamble: format === 'llama3' ? '' : 'Looking first.' });
      const parsed = parseToolCalls(format, text, { turn: 1 });
      expect(parsed.ok, format).toBe(true);
      if (!parsed.ok) continue;
      expect(
        parsed.calls.map((c) => c.function.name),
        format,
      ).toEqual(['read_file', 'run_shell']);
      const args = parsed.calls.map((c) =>
        typeof c.function.arguments === 'string' ? (JSON.parse(c.function.arguments) as unknown) : c.function.arguments,
      );
      expect(args, format).toEqual([{ path: 'a.py', start_line: 3 }, { command: 'ls -la' }]);
      const broken = writeToolCalls(format, [calls[0] as SimCall, { ...(calls[1] as SimCall), malformed: true }]);
      expect(parseToolCalls(format, broken, { turn: 1 }).ok, format).toBe(false);
    }
  });

  it("plans a request's rounds from its text and tools alone", () => {
    const tools = ['run_shell', 'read_file', 'edit_file', 'submit'];
    const plans = Array.from({ length: 200 }, (_, i) => agentPlan(`issue ${i}`, tools, 0.2));
    expect(agentPlan('issue 7', tools, 0.2)).toEqual(plans[7]);
    expect(agentPlan('  issue 7\n', tools, 0.2)).toEqual(plans[7]);
    for (const plan of plans) {
      expect(plan.length).toBeGreaterThanOrEqual(2);
      expect(plan.length).toBeLessThanOrEqual(7);
      // The finishing tool only ever alone, in the last round.
      for (const [k, round] of plan.entries()) {
        expect(round.length).toBeGreaterThanOrEqual(1);
        expect(round.length).toBeLessThanOrEqual(3);
        if (round.includes('submit')) expect([k, round.length]).toEqual([plan.length - 1, 1]);
      }
    }
    expect(new Set(plans.map((p) => p.length)).size).toBe(6);
    const parallel = plans.flat().filter((r) => r.length > 1).length / plans.flat().length;
    expect(parallel).toBeGreaterThan(0.1);
    expect(parallel).toBeLessThan(0.3);
    // With one or two tools, one round (now and then two).
    for (let i = 0; i < 50; i++) expect(agentPlan(`q ${i}`, ['get_weather'], 0).length).toBeLessThanOrEqual(2);
  });

  it('reads tools, the request and the rounds of a Kimi-style prompt', () => {
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }];
    const text =
      `<|im_system|>tool_declare<|im_middle|>${JSON.stringify(tools)}<|im_end|>` +
      '<|im_user|>user<|im_middle|>Weather in Oslo?<|im_end|>' +
      '<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|><|im_end|>' +
      '<|im_system|>tool<|im_middle|>3 °C<|im_end|><|im_assistant|>assistant<|im_middle|>';
    expect(readToolPrompt(text, 'kimi_k2')).toEqual({
      tools: [{ name: 'get_weather', parameters: { type: 'object' } }],
      request: 'Weather in Oslo?',
      rounds: 1,
      afterToolResults: true,
      earlierCalls: 1,
    });
    // Not asking for an answer (no generation prompt), or no tools: nothing to call.
    expect(readToolPrompt(text.slice(0, text.lastIndexOf('<|im_assistant|>')), 'kimi_k2')).toBeUndefined();
    expect(
      readToolPrompt('<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|>', 'kimi_k2'),
    ).toBe(undefined);
  });

  it('checks its options', () => {
    expect(resolveToolCalls(undefined).rates).toEqual({
      probability: 0.98,
      parallel: 0.2,
      divergent: 0.04,
      malformed: 0.02,
    });
    const r = resolveToolCalls({ probability: 0.5, perDataset: { b8: { malformed: 0.5 } } });
    expect(r.perDataset.get('b8')).toMatchObject({ probability: 0.5, malformed: 0.5 });
    expect(() => resolveToolCalls({ divergent: 1.5 })).toThrow(/toolCalls\.divergent must be a number in \[0, 1\]/);
    expect(() => resolveToolCalls({ format: 'xml' as never })).toThrow(/toolCalls\.format/);
  });
});
