-- wrk: WRK_DEPTH requests written back to back per round trip (HTTP/1.1 pipelining).
local depth = tonumber(os.getenv("WRK_DEPTH") or "32")
local batch

init = function(args)
  local r = {}
  for i = 1, depth do
    r[i] = wrk.format(nil)
  end
  batch = table.concat(r)
end

request = function()
  return batch
end
