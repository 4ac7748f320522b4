-- tinyloop.repl - an interactive LuaJIT session with tinyloop loaded.
--
--   bin/tinyloop repl [MODEL]          (or: luajit lua/tinyloop/repl.lua [MODEL])
--
-- An expression is printed (tables pretty-printed), a statement is run,
-- and input that ends too early (an "<eof>" syntax error) continues on the
-- next line. Line editing and history come from lua-readline when it is
-- installed (history in ~/.tinyloop_history); plain io.read otherwise.
-- Helpers (help() lists them): tok, detok, gen, stream, time, stats,
-- pools, info, and `model` / `pool` when a model was given.
local _M = {}

local format, concat = string.format, table.concat
local sort = table.sort


-- ---- pretty printing ------------------------------------------------------------------

local function is_array(t)
    local n = #t
    local count = 0
    for _ in pairs(t) do
        count = count + 1
    end
    return count == n, n
end


local function key_str(k)
    if type(k) == "string" and k:match("^[%a_][%w_]*$") then
        return k
    end
    return "[" .. (type(k) == "string" and format("%q", k) or tostring(k)) .. "]"
end


-- Renders v as Lua-like text: arrays inline, maps one key per line in
-- sorted order, nesting to `depth` levels, cycles shown as <cycle>.
local function pretty(v, indent, depth, seen)
    indent, depth, seen = indent or "", depth or 4, seen or {}
    local tv = type(v)
    if tv == "string" then
        return format("%q", v)
    elseif tv ~= "table" then
        return tostring(v)
    end
    local mt = getmetatable(v)
    if mt and mt.__tostring then
        return tostring(v)
    end
    if seen[v] then
        return "<cycle>"
    end
    if depth == 0 then
        return "{...}"
    end
    seen[v] = true
    local arr, n = is_array(v)
    local out
    if arr then
        if n == 0 then
            out = "{}"
        else
            local parts = {}
            for i = 1, n do
                parts[i] = pretty(v[i], indent, depth - 1, seen)
            end
            out = "{ " .. concat(parts, ", ") .. " }"
            if #out > 100 and type(v[1]) == "table" then
                out = "{\n" .. indent .. "  " .. concat(parts, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
            end
        end
    else
        local keys = {}
        for k in pairs(v) do
            keys[#keys + 1] = k
        end
        sort(keys, function(a, b)
            local ta, tb = type(a), type(b)
            if ta ~= tb then
                return ta < tb
            end
            if ta == "number" or ta == "string" then
                return a < b
            end
            return tostring(a) < tostring(b)
        end)
        local inner = indent .. "  "
        local parts = {}
        for i, k in ipairs(keys) do
            parts[i] = inner .. key_str(k) .. " = " .. pretty(v[k], inner, depth - 1, seen)
        end
        out = "{\n" .. concat(parts, ",\n") .. "\n" .. indent .. "}"
    end
    seen[v] = nil
    return out
end
_M.pretty = pretty


-- ---- the evaluator ----------------------------------------------------------------------

local Session = {}
local session_mt = { __index = Session }


local function pack(...)
    return { n = select("#", ...), ... }
end


-- new{ print = fn(text), model = Model|nil, model_path = str } -> session.
-- print receives every line of output (default: io.write with "\n").
function _M.new(opts)
    opts = opts or {}
    local out = opts.print or function(s)
        io.write(s, "\n")
    end
    local self = setmetatable({ out = out, buffer = nil, env = nil }, session_mt)
    self.env = _M.make_env(self, opts)
    return self
end


-- The prompt for the next line: "> " or ">> " inside a continued input.
function Session:prompt()
    return self.buffer and ">> " or "> "
end


-- Feeds one line. Returns "more" while the input is incomplete, else
-- "ok" or "error" (the message has then been printed).
function Session:feed(line)
    local src = self.buffer and (self.buffer .. "\n" .. line) or line
    if not self.buffer and src:match("^%s*=") then -- Lua 5.1 REPL habit: "=expr"
        src = "return " .. src:gsub("^%s*=", "")
    end
    local fn, err_expr = loadstring("return " .. src, "=stdin")
    local err
    if not fn then
        fn, err = loadstring(src, "=stdin")
    end
    if not fn then
        -- Incomplete as an expression ("x *") or as a statement ("for i = 1, 3 do"): read on.
        if err:match("<eof>'?$") or err_expr:match("<eof>'?$") then -- not an engine error: the Lua compiler's
            self.buffer = src
            return "more"
        end
        self.buffer = nil
        self.out(err)
        return "error"
    end
    self.buffer = nil
    setfenv(fn, self.env)
    local res = pack(pcall(fn))
    if not res[1] then
        self.out(tostring(res[2]))
        return "error"
    end
    if res.n > 1 then
        local parts = {}
        for i = 2, res.n do
            parts[#parts + 1] = pretty(res[i])
        end
        self.out(concat(parts, "\t"))
    end
    return "ok"
end


-- Cancels a continued input (Ctrl-C / an empty line after ">> " is not
-- special: Lua decides when input is complete).
function Session:reset()
    self.buffer = nil
end


-- ---- helpers ----------------------------------------------------------------------------

local HELP = [[
tinyloop REPL helpers (Lua expressions print their value):
  model, pool          the opened model (if a MODEL was given) and a PrefixPool(16)
  open(path, opts)     open a model and make it `model`
  tok("text")          token ids (BOS added); tok("text", false) without BOS
  detok(ids)           text of token ids
  gen("text", n)       greedy continuation of text, n tokens (default 32), as text
  stream("text", n)    like gen, printing tokens as they are produced
  register("text")     register text's tokens in `pool`; returns the count
  time(fn, ...)        runs fn, prints the seconds taken, returns fn's results
  stats()              the model's cache statistics
  pools()              `pool`'s entries count, tokens and statistics
  info()               the model's hyperparameters
  tl                   the tinyloop module; help() shows this]]

function _M.make_env(session, opts)
    local tl = require "tinyloop"
    local env = setmetatable({}, { __index = _G })
    local out = session.out
    env.tl = tl
    env.model = opts.model
    env.pool = tl.PrefixPool(16)

    local function need_model()
        local m = rawget(env, "model")
        if not m then
            error("no model: start with `bin/tinyloop repl MODEL` or call open(path)", 3)
        end
        return m
    end

    function env.help()
        out(HELP)
    end

    function env.open(path, o)
        env.model = tl.Model(path, o)
        env.pool = tl.PrefixPool(16)
        return env.model
    end

    function env.tok(text, add_special)
        return need_model():tokenize(text, { add_special = add_special ~= false })
    end

    function env.detok(ids)
        return need_model():detokenize(ids)
    end

    local function room(m, prompt, n)
        return math.max(1, math.min(n or 32, m.max_seq_len - #prompt))
    end

    function env.gen(text, n)
        local m = need_model()
        local prompt = m:tokenize(text)
        local ids, err = m:generate_with_pool(env.pool, prompt, { max_tokens = room(m, prompt, n), temperature = 0 })
        if not ids then
            return nil, err
        end
        return m:detokenize(ids)
    end

    function env.stream(text, n)
        local m = need_model()
        local prompt = m:tokenize(text)
        local pieces = {}
        io.write(text)
        for t in m:stream(prompt, { max_tokens = room(m, prompt, n), temperature = 0, pool = env.pool }) do
            local p = m:piece(t)
            pieces[#pieces + 1] = p
            io.write(p)
            io.flush()
        end
        io.write("\n")
        return #pieces
    end

    function env.register(text)
        local m = need_model()
        return m:register_prefix(env.pool, m:tokenize(text))
    end

    function env.time(fn, ...)
        local t0 = os.clock()
        local ok_tl, tlm = pcall(require, "tinyloop")
        if ok_tl and tlm.now then
            local wall0 = tlm.now()
            local res = pack(fn(...))
            out(format("%.3f s wall, %.3f s cpu", tlm.now() - wall0, os.clock() - t0))
            return unpack(res, 1, res.n)
        end
        local res = pack(fn(...))
        out(format("%.3f s cpu", os.clock() - t0))
        return unpack(res, 1, res.n)
    end

    function env.stats()
        return need_model():stats()
    end

    function env.info()
        return need_model():info()
    end

    function env.pools()
        local p = rawget(env, "pool")
        return { size = p:size(), total_cached_tokens = p:total_cached_tokens(), stats = p:stats() }
    end

    return env
end


-- ---- the interactive loop -------------------------------------------------------------

local function line_reader()
    local ok, RL = pcall(require, "readline")
    if ok and RL and RL.readline then
        local home = os.getenv("HOME")
        local hist = home and (home .. "/.tinyloop_history") or nil
        pcall(RL.set_options, { histfile = hist or "", keeplines = 1000, completion = false })
        return function(prompt)
            local line = RL.readline(prompt)
            if line and line:match("%S") then
                RL.add_history(line)
            end
            return line
        end, function()
            pcall(RL.save_history)
        end
    end
    return function(prompt)
        io.write(prompt)
        io.flush()
        return io.read("*l")
    end, function() end
end


-- run(args): args[1] is an optional model path.
function _M.run(args)
    local tl = require "tinyloop"
    local model
    if args[1] then
        local ok, m = pcall(tl.Model, args[1])
        if not ok then
            io.stderr:write(tostring(m), "\n")
            return 1
        end
        model = m
    end
    local session = _M.new { model = model }
    print(format("tinyloop %s (%s) - help() for helpers, Ctrl-D to quit", tl._VERSION, jit and jit.version
        or _VERSION))
    if model then
        local i = model:info()
        print(format("model: %s (%s, %d layers, vocab %d, max_seq_len %d)", args[1], i.arch, i.n_layer,
            i.n_vocab, i.max_seq_len))
    end
    local read, finish = line_reader()
    while true do
        local line = read(session:prompt())
        if not line then
            break
        end
        session:feed(line)
    end
    finish()
    io.write("\n")
    return 0
end


if arg and arg[0] and arg[0]:match("repl%.lua$") and not package.loaded["tinyloop.repl"] then
    os.exit(_M.run(arg))
end

return _M
