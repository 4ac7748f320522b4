-- The REPL: its evaluator fed line by line, and the real `tinyloop repl`
-- driven through a pty (tmux).
local helpers = require "helpers"

describe("tinyloop.repl", function()
    local repl = require "tinyloop.repl"
    local lines, session

    before_each(function()
        lines = {}
        session = repl.new { print = function(s) lines[#lines + 1] = s end }
    end)

    local function feed(...)
        local st
        for _, l in ipairs { ... } do
            st = session:feed(l)
        end
        return st
    end

    describe(":feed()", function()
        it("prints the value of an expression", function()
            assert.are.equal("ok", feed("1 + 1"))
            assert.are.same({ "2" }, lines)
        end)

        it("prints several values separated by tabs", function()
            feed("1, 'a', nil")
            assert.are.same({ '1\t"a"\tnil' }, lines)
        end)

        it("runs a statement and prints nothing; its globals persist", function()
            assert.are.equal("ok", feed("x = 21"))
            assert.are.same({}, lines)
            feed("x * 2")
            assert.are.same({ "42" }, lines)
        end)

        it("keeps session globals out of _G", function()
            feed("leak_check = 1")
            assert.is_nil(rawget(_G, "leak_check"))
        end)

        it("continues an incomplete statement on the next lines", function()
            assert.are.equal("more", feed("function f(a)"))
            assert.are.equal(">> ", session:prompt())
            assert.are.equal("more", feed("  return a * 3"))
            assert.are.equal("ok", feed("end"))
            assert.are.equal("> ", session:prompt())
            feed("f(5)")
            assert.are.same({ "15" }, lines)
        end)

        it("continues an incomplete expression", function()
            assert.are.equal("more", feed("1 +"))
            assert.are.equal("ok", feed("2"))
            assert.are.same({ "3" }, lines)
        end)

        it("accepts the Lua 5.1 '=expr' form", function()
            feed("= 6 * 7")
            assert.are.same({ "42" }, lines)
        end)

        it("reports a syntax error and starts afresh", function()
            assert.are.equal("error", feed("x = = 1"))
            assert.truthy(lines[1]:find("unexpected symbol", 1, true), lines[1])
            assert.are.equal("> ", session:prompt())
        end)

        it("reports a runtime error with its message", function()
            assert.are.equal("error", feed("error('boom')"))
            assert.are.equal(1, #lines)
            assert.truthy(lines[1]:find("boom$"), lines[1])
            feed("local t = nil; t.x = 1")
            assert.truthy(lines[2]:find("^stdin:1: attempt to index"), lines[2])
        end)

        it("pretty-prints tables: arrays inline, maps sorted one key per line", function()
            feed("{ 1, 2, 3 }")
            feed("{ b = 2, a = { 1, 'x' }, ['k y'] = true }")
            assert.are.same({ "{ 1, 2, 3 }", '{\n  a = { 1, "x" },\n  b = 2,\n  ["k y"] = true\n}' }, lines)
        end)

        it("shows cycles and deep nesting without looping", function()
            feed("t = {}; t.self = t; return t")
            assert.are.same({ "{\n  self = <cycle>\n}" }, lines)
        end)

        it("lists its helpers with help()", function()
            feed("help()")
            assert.truthy(lines[1]:find("gen(\"text\", n)", 1, true))
        end)

        it("explains that tok() needs a model when none is open", function()
            feed("tok('x')")
            assert.truthy(lines[1]:find("no model", 1, true), lines[1])
        end)
    end)

    describe("helpers with a model", function()
        if helpers.skip_without_model() then
            return
        end

        it("tokenize, generate, register, time and show statistics", function()
            feed("open(" .. string.format("%q", helpers.model_path) .. ")")
            lines = {}
            feed("tok('Once upon a time')")
            assert.are.same({ "{ 1, 403, 407, 261, 378 }" }, lines)
            lines = {}
            feed("gen('Once upon a time', 8)")
            assert.are.same({ '"Once upon a time, there was a little girl"' }, lines)
            lines = {}
            feed("register('Once upon a time')")
            assert.are.same({ "5" }, lines)
            lines = {}
            feed("pools().size, pools().total_cached_tokens")
            assert.are.same({ "1\t5" }, lines)
            lines = {}
            feed("stats().blocks_total > 0")
            assert.are.same({ "true" }, lines)
            lines = {}
            feed("time(function() return 7 end)")
            assert.truthy(lines[1]:match("^[%d.]+ s wall, [%d.]+ s cpu$"), lines[1])
            assert.are.equal("7", lines[2])
            feed("model:close()")
        end)
    end)
end)


describe("bin/tinyloop repl through a pty", function()
    local _, has_tmux = helpers.run("command -v tmux")
    if not has_tmux then
        pending("SKIP: tmux not installed")
        return
    end
    if helpers.skip_without_model() then
        return
    end
    local root = helpers.root
    -- `bin/tinyloop repl` once the CLI dispatches to tl_cli_repl; until then
    -- the script it runs.
    local probe = helpers.run("'" .. root .. "/bin/tinyloop' repl </dev/null 2>&1")
    local cmd
    if probe:find("tinyloop 0.", 1, true) then
        cmd = "'" .. root .. "/bin/tinyloop' repl '" .. helpers.model_path .. "'"
    else
        cmd = helpers.luajit_cmd() .. " '" .. root .. "/lua/tinyloop/repl.lua' '" .. helpers.model_path .. "'"
    end
    local name = "tlrepl" .. tostring(os.time()) .. tostring(math.random(1e6))

    local function tmux(args)
        return helpers.run("tmux -L " .. name .. " " .. args)
    end

    local function capture()
        return (tmux("capture-pane -p -t " .. name .. " -S -100"))
    end

    local function wait_for(text, secs)
        local deadline = os.time() + (secs or 10)
        local screen
        repeat
            screen = capture()
            if screen:find(text, 1, true) then
                return screen
            end
            os.execute("sleep 0.1")
        until os.time() > deadline
        return screen
    end

    -- Types a line literally (-l: "end" is a word, not the End key).
    local function type_line(text)
        tmux("send-keys -t " .. name .. " -l " .. string.format("%q", text):gsub("%$", "\\$"))
        tmux("send-keys -t " .. name .. " Enter")
    end

    teardown(function()
        tmux("kill-server")
    end)

    it("opens the model, evaluates input and pretty-prints results", function()
        local _, ok = tmux("new-session -d -s " .. name .. " -x 200 -y 50 \"HOME=" .. helpers.tmpdir() .. " "
            .. cmd:gsub('"', '\\"') .. "\"")
        assert.is_true(ok)
        local screen = wait_for("> ")
        assert.truthy(screen:find("model: " .. helpers.model_path, 1, true), screen)
        type_line("tok('Once upon a time')")
        screen = wait_for("{ 1, 403, 407, 261, 378 }")
        assert.truthy(screen:find("{ 1, 403, 407, 261, 378 }", 1, true), screen)
        type_line("for i = 1, 2 do")
        type_line("print(i * 10)")
        type_line("end")
        screen = wait_for("20")
        assert.truthy(screen:find(">> ", 1, true), screen)
        assert.truthy(screen:find("\n10\n20\n", 1, true), screen)
        type_line("gen('Once upon a time', 8)")
        screen = wait_for("little girl\"")
        assert.truthy(screen:find('"Once upon a time, there was a little girl"', 1, true), screen)
        tmux("send-keys -t " .. name .. " C-d")
    end)
end)
