-- A REPL session that edits a routing policy while it serves and shows the
-- reload: each line below is fed to the tinyloop REPL (tinyloop.repl, as
-- `bin/tinyloop repl` does) and echoed with its output, so running this
-- prints the transcript (examples/policies/repl_session.txt).
--
--   luajit examples/policies/repl_session.lua
local root = (arg and arg[0] and arg[0]:match("^(.*)/examples/policies/[^/]*$")) or "."
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path

local repl = require "tinyloop.repl"

local lines = {
    -- a working copy of the example routing policy, served by a runtime
    [[policy = require "tinyloop.policy"]],
    [[path = os.tmpname()]],
    [[src = io.open("]] .. root .. [[/examples/policies/routing.lua"):read("*a")]],
    [[function save(text) local f = io.open(path, "w") f:write(text) f:close() end]],
    [[save(src)]],
    [[rt = policy.Runtime{ path = path, kind = "routing", interval_ms = 0, log = print }]],
    [[cands = { { id = "gpu0", load = 3, capacity = 8, match = 0 }, { id = "gpu1", load = 0, capacity = 8 } }]],
    [[req = { tokens = { 1, 2, 3 }, tenant = "shop" }]],
    [[= policy.route(rt.current, req, cands).id]],
    -- a request in flight holds its version
    [[inflight = rt:acquire()]],
    -- a bad edit (always the first candidate): its own self_test rejects it
    [[save((src:gsub("return best\n", "return cands[1]\n", 1)))]],
    [[= rt:maybe_reload()]],
    -- a good edit: tenant "shop" sticks to gpu0 while it has room (version 2)
    [[v2 = src:gsub('"example%-capacity%-1"', '"example-capacity-2"')]],
    [[sticky = "if req.tenant == 'shop' and not full(cands[1]) then return cands[1] end\n    "]],
    [[v2 = v2:gsub("local best, best_key\n", sticky .. "local best, best_key\n", 1)]],
    [[save(v2)]],
    [[= rt:maybe_reload()]],
    [[= policy.route(rt.current, req, cands).id]],
    -- the request in flight still runs on version 1
    [[= inflight.version, rt.current.version, policy.route(inflight, req, cands).id]],
    [[rt:release(inflight)]],
    -- a broken edit is rejected with file:line and the old version keeps serving
    [[save("return { kind = 'routing', version = ")]],
    [[= rt:maybe_reload()]],
    [[= rt.current.version]],
    [[= rt:counters()]],
    [[os.remove(path)]],
}

local session = repl.new { print = function(s) io.write(s, "\n") end }
for _, line in ipairs(lines) do
    io.write(session:prompt(), line, "\n")
    local r = session:feed(line)
    if r == "error" then
        os.exit(1)
    end
end
