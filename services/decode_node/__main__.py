from services.decode_node.main import main

raise SystemExit(main())
