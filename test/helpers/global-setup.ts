// Runs once before all test files.
export default function setup(): void {}
